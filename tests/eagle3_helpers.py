"""Builds EAGLE-3 drafters for tiny targets: random ones (losslessness does not depend on quality) and
briefly trained ones (for acceptance checks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from specdec import LLM, SamplingParams
from specdec.drafting.eagle3_format import save_eagle3
from specdec.drafting.eagle3_model import Eagle3Drafter
from specdec.training.eagle3_objective import default_eagle3_config
from specdec.training.self_distill import Sample


def make_random_eagle3(target, folder: Path, draft_vocab_size: int | None = None, seed: int = 0) -> str:
    vocab = target.vocab_size
    size = draft_vocab_size or vocab
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=gen)[:size].sort().values
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(default_eagle3_config(target, size))
    drafter.set_draft_vocab(ids)
    save_eagle3(folder, drafter.to(target.dtype), target)
    return str(folder)


def greedy_samples(target, n: int, prompt_len: int = 12, response_len: int = 40, seed: int = 0) -> list[Sample]:
    """Random prompts, responses written greedily by the target (what `specdec data generate` stores)."""
    llm = LLM(loaded=target)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, target.vocab_size, (prompt_len,), generator=gen).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=response_len, ignore_eos=True)
        response = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
        out.append(Sample(f"s{i}", "test", prompt, list(response)))
    return out


def write_data_dir(folder: Path, samples: list[Sample]) -> Path:
    """A data directory as `specdec data generate` writes it (samples.jsonl), for the training commands."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": s.id, "kind": s.kind, "prompt_ids": s.prompt_ids, "response_ids": s.response_ids} for s in samples]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder
