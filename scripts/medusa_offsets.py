#!/usr/bin/env python3
"""Which token does each Medusa head predict? Teacher-forced top-1 agreement of head k (at the final hidden
state of position i) with the token at i + d, for offsets d = 1..5, on the target's plain outputs of the
benchmark prompts and on generated training samples. Head k is trained for d = k + 2; a head that mostly
matches d = 1 only repeats what the target's own head already knows.

    .venv/bin/python scripts/medusa_offsets.py [DRAFTER] [--train-samples 40]

Uses the plain outputs cached by scripts/context_vocab_accuracy.py (out/plain-outputs.json; made if missing).
Diagnostic only: nothing here is trained on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdec.training.features import FeatureExtractor
from specdec.training.self_distill import read_samples

from context_vocab_accuracy import plain_outputs, target_and_proposer  # scripts/ is on sys.path when a script here runs

ROOT = Path(__file__).resolve().parents[1]
OFFSETS = range(1, 6)


def agreement(heads, features: FeatureExtractor, rows: list[dict]) -> torch.Tensor:
    """[heads, offsets] share of response positions whose head-k top-1 equals the token at i + d."""
    k_heads = heads.config.num_heads
    hits = torch.zeros(k_heads, len(OFFSETS))
    counts = torch.zeros(k_heads, len(OFFSETS))
    draft_ids = heads.draft_ids()
    for r in rows:
        full = list(r["prompt"]) + list(r["response"])
        ids = torch.tensor(full)
        final = features.compute(full).final_hidden.float()
        start = len(r["prompt"]) - 1  # the last prompt position: its next token is the response's first
        with torch.no_grad():
            for k in range(k_heads):
                top = draft_ids[heads.logits(heads.head_state(k, final[start:]), k).argmax(-1)]
                for j, d in enumerate(OFFSETS):
                    n = len(full) - start - d
                    if n > 0:
                        hits[k, j] += (top[:n] == ids[start + d : start + d + n]).sum()
                        counts[k, j] += n
    return hits / counts.clamp(min=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", nargs="?", default="gemma-3-270m-medusa")
    ap.add_argument("--mt-limit", type=int, default=10)
    ap.add_argument("--train-samples", type=int, default=40, help="generated samples, spread over the data set")
    ap.add_argument("--data", default=str(ROOT / "datasets/gemma-3-270m-distill-128"), help="a data directory")
    ap.add_argument("--cache", default=str(ROOT / "out/plain-outputs.json"))
    args = ap.parse_args()
    plain, proposer = target_and_proposer("medusa", args.drafter)
    heads = proposer.heads.float()
    heads.attach_target(plain.model.decoder.head_weight().float())
    features = FeatureExtractor(plain.model, ())
    sets = plain_outputs(plain, Path(args.cache), args.mt_limit)
    if args.train_samples:
        samples = read_samples(Path(args.data))
        step = max(len(samples) // args.train_samples, 1)
        sets["training samples"] = [{"prompt": s.prompt_ids, "response": s.response_ids}
                                    for s in samples[::step][: args.train_samples]]
    print("set               head  " + "  ".join(f"i+{d}" for d in OFFSETS) + "   (trained for i+k+2)")
    for name, rows in sets.items():
        table = agreement(heads, features, rows)
        for k, row in enumerate(table.tolist()):
            print(f"{name:17s} {k:4d}  " + "  ".join(f"{v:.2f}" for v in row))


if __name__ == "__main__":
    main()
