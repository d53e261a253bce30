#!/usr/bin/env python3
"""How much a learned EAGLE-3 drafter gains from proposing the context's tokens (speculative_config
`context_vocab`), measured without the engine: teacher-forced first-step argmax accuracy against the
target's greedy outputs on the benchmark prompts, with the draft vocabulary (a) static, (b) static plus the
tokens seen so far, (c) the whole target vocabulary; and the coverage of (a) and (b).

    .venv/bin/python scripts/context_vocab_accuracy.py [DRAFTER] [--mt-limit 10]

The plain outputs (128 tokens, greedy) are cached in out/plain-outputs.json. Diagnostic only: nothing here
is trained on.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from specdec.api import LLM
from specdec.bench.prompts import load_questions, render_prompt
from specdec.sampling_params import SamplingParams
from specdec.training.features import FeatureExtractor

ROOT = Path(__file__).resolve().parents[1]
SETS = {"mt_bench": ROOT.parent / "shared/data/eval/mt_bench/question.jsonl",
        "other_kinds": ROOT / "benchmarks/prompts/other_kinds.jsonl"}


def target_and_proposer(method: str, drafter: str) -> tuple[LLM, Any]:
    """The default target (plain decoding) and the proposer of `drafter` loaded over the same weights."""
    plain = LLM("gemma-3-270m")
    spec = LLM("gemma-3-270m", speculative_config={"method": method, "model": drafter}, loaded=plain.model)
    return plain, spec.proposer


def plain_outputs(llm: LLM, cache: Path, mt_limit: int) -> dict[str, list[dict]]:
    if cache.is_file():
        return json.loads(cache.read_text())
    tok, params, out = llm.get_tokenizer(), SamplingParams(max_tokens=128, temperature=0), {}
    for name, path in SETS.items():
        qs = load_questions(path, categories=["writing"] if name == "mt_bench" else None)
        rows = []
        for q in qs[:mt_limit] if name == "mt_bench" else qs:
            ids = render_prompt(tok, q.turns[:1], [])
            (o,) = llm.generate({"prompt_token_ids": ids}, params)
            rows.append({"category": q.category, "prompt": ids, "response": list(o.outputs[0].token_ids)})
        out[name] = rows
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def first_step_logits(drafter: Any, features: FeatureExtractor, head: torch.Tensor, full: list[int],
                      prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced first draft step over a response: (indices t [n], whole-vocabulary logits [n, V]),
    index t predicting full[t + 2] after the context full[: t + 2]."""
    feats = features.compute(full)
    with torch.no_grad():
        h = drafter.fuse(torch.cat([feats.hidden[i] for i in drafter.config.aux_layer_ids], -1).float())
        n = len(full) - 1
        h = drafter.train_unrolled(h[:n], torch.tensor(full[1:]), torch.arange(n), [], [])
        rows = torch.arange(prompt_len - 2, len(full) - 2)
        return rows, torch.nn.functional.linear(drafter.norm(h[rows]).to(head.dtype), head).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", nargs="?", default="gemma-3-270m-eagle3")
    ap.add_argument("--mt-limit", type=int, default=10)
    ap.add_argument("--cache", default=str(ROOT / "out/plain-outputs.json"))
    args = ap.parse_args()
    plain, proposer = target_and_proposer("eagle3", args.drafter)
    d = proposer.drafter
    head = plain.model.decoder.head_weight()
    static = d.draft_ids()
    static_set = set(static.tolist())
    features = FeatureExtractor(plain.model, d.config.aux_layer_ids)
    print("set         category       acc static  static+ctx  full vocab   cover static  static+ctx")
    for name, rows in plain_outputs(plain, Path(args.cache), args.mt_limit).items():
        agg: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
        for r in rows:
            full = r["prompt"] + r["response"]
            rows_t, logits = first_step_logits(d, features, head, full, len(r["prompt"]))
            a = agg[r["category"]]
            for k, t in enumerate(rows_t.tolist()):
                want, lg, seen = full[t + 2], logits[k], set(full[: t + 2])
                masked = lg.new_full(lg.shape, float("-inf"))
                masked[static] = lg[static]
                a[0] += int(masked.argmax()) == want
                extra = torch.tensor(sorted(seen - static_set), dtype=torch.long)
                masked[extra] = lg[extra]
                a[1] += int(masked.argmax()) == want
                a[2] += int(lg.argmax()) == want
                a[3] += want in static_set
                a[4] += want in static_set or want in seen
                a[5] += 1
        total = [sum(v[i] for v in agg.values()) for i in range(6)]
        for cat, a in [*agg.items(), ("all", total)]:
            n = a[5]
            print(f"{name:11s} {cat:14s} {a[0]/n:10.3f}  {a[1]/n:10.3f}  {a[2]/n:10.3f}   {a[3]/n:12.3f}  {a[4]/n:10.3f}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
