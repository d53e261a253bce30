"""specdec's half of benchmarks/peers/vllm_dflash_tiny.py, run with the *project's* python.

    .venv/bin/python benchmarks/peers/dflash_tiny_qwen3.py --work DIR --prompts 8 --max-tokens 48

Builds a tiny random Qwen3 (vLLM's DFlash needs a target with the EAGLE-3 interface; the byte-level
tokenizer of eagle3_tiny_llama.py), saves it to DIR/target, trains a DFlash drafter of block B = K + 1 for
it briefly with our trainer on responses the target wrote greedily, exports it with `export_for_vllm` to
DIR/dflash-vllm, decodes the same random prompts with specdec (plain and the exported drafter, a chain of
K = B - 1, context_vocab off: what vLLM drafts) and writes DIR/specdec.json.

The target's attention output projections are zeroed, so its next token depends on the current token
only: a drafter learns it in a few dozen steps, yet not perfectly, so acceptance is neither 0 nor 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eagle3_tiny_llama import byte_tokenizer, decode, random_prompts
from specdec import LLM, SamplingParams
from specdec.drafting.vllm_export import export_for_vllm
from specdec.models.loading import load_model
from specdec.training.self_distill import Sample
from specdec.training.train_dflash import DFlashTrainOptions, train_dflash
from specdec.training.trainer import TrainSettings

K = 4  # draft tokens per step, both engines: the whole block after its anchor (vLLM's block is 1 + K)
DRAFT_VOCAB = 192  # < the target's 272 tokens, so the d2t mapping and the stored LM head rows are exercised


def build_target(folder: Path) -> None:
    """hidden 256, 4 heads of 64 (a head size vLLM's CPU attention takes), 4 layers, 272 tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=272, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.08)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()  # next token = f(current token)
    model.to(torch.bfloat16).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--train-steps", type=int, default=60)
    args = ap.parse_args()
    folder, drafter, export = args.work / "target", args.work / "dflash", args.work / "dflash-vllm"
    build_target(folder)
    target = load_model(str(folder), dtype="bfloat16")
    writer = LLM(loaded=target)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    samples = [Sample(f"s{i}", "random", p,
                      list(writer.generate({"prompt_token_ids": p}, greedy)[0].outputs[0].token_ids))
               for i, p in enumerate(random_prompts(64, 12, seed=1))]
    settings = TrainSettings(max_steps=args.train_steps, tokens_per_step=256, lr=1e-2, warmup_steps=5,
                             val_fraction=0.1, checkpoint_every=args.train_steps)
    report = train_dflash(target, samples, drafter, settings,
                          DFlashTrainOptions(block_size=K + 1, num_layers=2, draft_vocab_size=DRAFT_VOCAB,
                                             num_anchors=32, context_vocab=False),
                          progress=False, overwrite=True)
    export_for_vllm(drafter, target, str(folder), export)
    prompts = random_prompts(args.prompts, 16, seed=7)  # not the training prompts
    result = {"target": str(folder), "export": str(export), "k": K, "prompt_token_ids": prompts,
              "max_tokens": args.max_tokens, "validation": report.get("validation", {}),
              "modes": {"plain": decode(target, None, prompts, args.max_tokens),
                        "dflash": decode(target, {"method": "dflash", "model": str(export), "num_speculative_tokens": K,
                                                  "context_vocab": False, "confidence_threshold": 0.0},
                                         prompts, args.max_tokens)}}
    (args.work / "specdec.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["modes"]["dflash"]["stats"]))


if __name__ == "__main__":
    main()
