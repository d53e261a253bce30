"""specdec's half of benchmarks/peers/vllm_eagle3_tiny.py, run with the *project's* python.

    .venv/bin/python benchmarks/peers/eagle3_tiny_llama.py --work DIR --prompts 8 --max-tokens 48

Builds a tiny random Llama with transformers (byte-level BPE tokenizer built with `tokenizers`, no hub),
saves it to DIR/target, trains an EAGLE-3 drafter for it briefly with our trainer on responses the target
wrote greedily, exports it with `export_for_vllm` to DIR/eagle3-vllm, decodes the same random prompts
with specdec (plain and the exported drafter, a chain of K), and writes DIR/specdec.json.

The target's attention output projections are zeroed, so its next token depends on the current token
only: a drafter learns it in a few dozen steps, yet not perfectly, so acceptance is neither 0 nor 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdec import LLM, SamplingParams
from specdec.drafting.vllm_export import export_for_vllm
from specdec.models.loading import load_model
from specdec.training.self_distill import Sample
from specdec.training.train_eagle3 import Eagle3TrainOptions, train_eagle3
from specdec.training.trainer import TrainSettings

K = 4  # draft tokens per step, both engines
DRAFT_VOCAB = 192  # < the target's 272 tokens, so the d2t mapping and the stored LM head rows are exercised


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>"])}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build_target(folder: Path, family: str = "llama") -> None:
    """hidden 256, 4 heads of 64 (a head size vLLM's CPU attention takes), 4 layers, 272 tokens; a Llama, or
    a Qwen3 (`family="qwen3"`, for vLLM's DFlash)."""
    import transformers

    config_class, model_class, extra = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 64}),
    }[family]
    torch.manual_seed(0)
    config = config_class(vocab_size=272, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **extra)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.08)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()  # next token = f(current token)
    model.to(torch.bfloat16).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1, *torch.randint(3, 259, (length,), generator=gen).tolist()] for _ in range(n)]


def decode(target, config: dict | None, prompts: list[list[int]], max_tokens: int) -> dict:
    llm = LLM(loaded=target, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start, outs = time.perf_counter(), []
    for ids in prompts:
        outs.append(llm.generate({"prompt_token_ids": ids}, params)[0])
    seconds = time.perf_counter() - start
    stats = outs[0].spec_decoding_stats
    for o in outs[1:]:
        stats.merge(o.spec_decoding_stats)
    return {"config": config, "seconds": seconds, "token_ids": [list(o.outputs[0].token_ids) for o in outs],
            "stats": stats.to_dict()}


Train = Callable[[Any, list[Sample], Path, TrainSettings], dict]


def train_export_decode(method: str, family: str, train: Train, spec: dict[str, Any]) -> None:
    """The whole specdec side for `method`: build the target, train a drafter on its greedy responses with
    `train(target, samples, drafter_dir, settings)`, export it, decode plain and with the export (`spec`:
    the speculative_config keys beyond method, model and K) and write WORK/specdec.json."""
    ap = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--train-steps", type=int, default=60)
    args = ap.parse_args()
    folder, drafter, export = args.work / "target", args.work / method, args.work / f"{method}-vllm"
    build_target(folder, family)
    target = load_model(str(folder), dtype="bfloat16")
    writer = LLM(loaded=target)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    samples = [Sample(f"s{i}", "random", p, list(writer.generate({"prompt_token_ids": p}, greedy)[0].outputs[0].token_ids))
               for i, p in enumerate(random_prompts(64, 12, seed=1))]
    settings = TrainSettings(max_steps=args.train_steps, tokens_per_step=256, lr=1e-2, warmup_steps=5,
                             val_fraction=0.1, checkpoint_every=args.train_steps)
    report = train(target, samples, drafter, settings)
    export_for_vllm(drafter, target, str(folder), export)
    prompts = random_prompts(args.prompts, 16, seed=7)  # not the training prompts
    config = {"method": method, "model": str(export), "num_speculative_tokens": K, **spec}
    result = {"target": str(folder), "export": str(export), "k": K, "prompt_token_ids": prompts,
              "max_tokens": args.max_tokens, "validation": report.get("validation", {}),
              "modes": {"plain": decode(target, None, prompts, args.max_tokens),
                        method: decode(target, config, prompts, args.max_tokens)}}
    (args.work / "specdec.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["modes"][method]["stats"]))


def main() -> None:
    def train(target: Any, samples: list[Sample], drafter: Path, settings: TrainSettings) -> dict:
        return train_eagle3(target, samples, drafter, settings,
                            Eagle3TrainOptions(draft_vocab_size=DRAFT_VOCAB, ttt_steps=3, num_speculative_tokens=K),
                            progress=False, overwrite=True)

    train_export_decode("eagle3", "llama", train, {"context_vocab": False})


if __name__ == "__main__":
    main()
