#!/usr/bin/env python3
"""How far can a Medusa drafter's static tree go? Teacher-forced on the target's plain outputs of the benchmark
prompts (and on training samples), each response position i gets the rank of the true token i + k + 2 among
head k's top 10. A tree accepts the deepest of its paths whose ranks all match, so its mean acceptance
length follows exactly (static vocabulary, no `context_vocab`), for three trees of each size:

- `config`: the drafter's own tree (`tree_from_accuracy` on its measured head accuracies), as served;
- `train`: the paths most often right on the training samples (what a data-driven tree could do);
- `oracle`: the paths most often right on the evaluated set itself (an upper bound for that size; tuned
  on the very prompts it scores, so never a figure to report as a result).

    .venv/bin/python scripts/medusa_tree_bound.py [DRAFTER] [--train-samples 100] [--threads 2]

Uses the plain outputs cached by scripts/context_vocab_accuracy.py (out/plain-outputs.json; made if missing).
Diagnostic only: nothing here is trained on.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

from specdec.drafting.medusa_model import tree_from_accuracy
from specdec.drafting.shipped import resolve_drafter
from specdec.training.features import FeatureExtractor
from specdec.training.self_distill import read_samples

from context_vocab_accuracy import plain_outputs, target_and_proposer  # scripts/ is on sys.path when a script here runs

ROOT = Path(__file__).resolve().parents[1]
TOP = 10
SIZES = (4, 8, 10, 12, 16, 20, 24, 32)


def rank_table(heads, features: FeatureExtractor, rows: list[dict]) -> torch.Tensor:
    """[positions, heads] rank of the token at i + k + 2 in head k's top TOP (TOP: not among them)."""
    k_heads, draft_ids, out = heads.config.num_heads, heads.draft_ids(), []
    for r in rows:
        full = list(r["prompt"]) + list(r["response"])
        ids = torch.tensor(full)
        start = len(r["prompt"]) - 1  # the last prompt position: its next token is the response's first
        final = features.compute(full).final_hidden.float()[start:]
        n = len(full) - start - k_heads - 1  # positions where every head has its token
        if n <= 0:
            continue
        ranks = torch.full((n, k_heads), TOP, dtype=torch.long)
        with torch.no_grad():
            for k in range(k_heads):
                top = draft_ids[heads.logits(heads.head_state(k, final[:n]), k).topk(TOP, -1).indices]
                match = top == ids[start + k + 2 : start + k + 2 + n, None]
                ranks[:, k] = torch.where(match.any(-1), match.float().argmax(-1), torch.full((n,), TOP))
        out.append(ranks)
    return torch.cat(out)


def mean_acceptance_length(ranks: torch.Tensor, paths: list[tuple[int, ...]]) -> float:
    deepest = torch.zeros(len(ranks))
    for p in paths:
        hit = (ranks[:, : len(p)] == torch.tensor(p)).all(-1)
        deepest = torch.maximum(deepest, hit.float() * len(p))
    return 1.0 + deepest.mean().item()


def most_often_right(ranks: torch.Tensor, size: int) -> list[tuple[int, ...]]:
    """The `size` paths right most often: a prefix is right at least as often, so they form a tree."""
    counts: collections.Counter = collections.Counter()
    for row in ranks.tolist():
        for d in range(1, len(row) + 1):
            if row[d - 1] >= TOP:
                break
            counts[tuple(row[:d])] += 1
    return [p for p, _ in counts.most_common(size)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", nargs="?", default="gemma-3-270m-medusa")
    ap.add_argument("--mt-limit", type=int, default=10)
    ap.add_argument("--train-samples", type=int, default=100, help="generated samples, spread over the data set")
    ap.add_argument("--data", default=str(ROOT / "datasets/gemma-3-270m-distill-128"))
    ap.add_argument("--cache", default=str(ROOT / "out/plain-outputs.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    plain, proposer = target_and_proposer("medusa", args.drafter)
    heads = proposer.heads.float()
    heads.attach_target(plain.model.decoder.head_weight().float())
    features = FeatureExtractor(plain.model, ())
    samples = read_samples(Path(args.data))
    step = max(len(samples) // args.train_samples, 1)
    train_rows = [{"prompt": s.prompt_ids, "response": s.response_ids} for s in samples[::step][: args.train_samples]]
    sets = {name: rank_table(heads, features, rows) for name, rows in plain_outputs(plain, Path(args.cache),
                                                                                     args.mt_limit).items()}
    train_ranks = rank_table(heads, features, train_rows)
    accuracy = json.loads((resolve_drafter(args.drafter) / "config.json").read_text())["specdec"]["head_rank_accuracy"]
    for name, ranks in {**sets, "training samples": train_ranks}.items():
        print(f"{name} ({len(ranks)} positions): top-1 per head "
              + ", ".join(f"{(ranks[:, k] == 0).float().mean():.2f}" for k in range(ranks.shape[1])))
    print("\nmean acceptance length by tree size (config tree / training-data tree / oracle tree)")
    print("nodes  " + "  ".join(f"{name:>24s}" for name in sets))
    for size in SIZES:
        trees = (tree_from_accuracy(accuracy, size), most_often_right(train_ranks, size))
        cells = [" / ".join(f"{mean_acceptance_length(r, t):.2f}" for t in (*trees, most_often_right(r, size)))
                 for r in sets.values()]
        print(f"{size:5d}  " + "  ".join(f"{c:>24s}" for c in cells))


if __name__ == "__main__":
    main()
