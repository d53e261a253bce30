#!/usr/bin/env python3
"""Does an EAGLE-3 drafter copy from its prompt? Teacher-forced first-step accuracy (whole vocabulary) on the
target's plain outputs of the other-kinds benchmark prompts, split into copyable positions (the last 3 tokens
occurred earlier and were followed by the token the target wrote) and the rest, per category.

    .venv/bin/python scripts/copy_accuracy.py [DRAFTER]

Uses the plain outputs cached by scripts/context_vocab_accuracy.py (out/plain-outputs.json; made if missing).
Diagnostic only: nothing here is trained on.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from specdec.training.features import FeatureExtractor

from context_vocab_accuracy import first_step_logits, plain_outputs, target_and_proposer  # scripts/ on sys.path

ROOT = Path(__file__).resolve().parents[1]


def lookup(context: list[int], n: int = 3) -> int | None:
    """The token after the latest earlier occurrence of the context's last n tokens."""
    key = context[-n:]
    for s in range(len(context) - n - 1, -1, -1):
        if context[s : s + n] == key:
            return context[s + n]
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", nargs="?", default="gemma-3-270m-eagle3")
    ap.add_argument("--cache", default=str(ROOT / "out/plain-outputs.json"))
    args = ap.parse_args()
    plain, proposer = target_and_proposer("eagle3", args.drafter)
    d = proposer.drafter
    head = plain.model.decoder.head_weight()
    features = FeatureExtractor(plain.model, d.config.aux_layer_ids)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # copy hits, copy n, other hits, other n
    for r in plain_outputs(plain, Path(args.cache), mt_limit=10)["other_kinds"]:
        full = r["prompt"] + r["response"]
        rows, logits = first_step_logits(d, features, head, full, len(r["prompt"]))
        best = logits.argmax(-1).tolist()
        c = counts[r["category"]]
        for k, t in enumerate(rows.tolist()):
            want = full[t + 2]
            hit = int(best[k] == want)
            if lookup(full[: t + 2]) == want:
                c[0] += hit
                c[1] += 1
            else:
                c[2] += hit
                c[3] += 1
    print("category        copyable share   accuracy there   accuracy elsewhere")
    for cat, c in counts.items():
        print(f"{cat:14s}  {c[1] / (c[1] + c[3]):14.2f}   {c[0] / max(c[1], 1):14.3f}   {c[2] / max(c[3], 1):18.3f}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
