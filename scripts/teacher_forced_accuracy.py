#!/usr/bin/env python3
"""A drafter's per-step accuracy on the benchmark's plain outputs, teacher-forced: the trainer's own
validation metric (correct / scored per draft step, or per block slot for DFlash, conditional on the steps
before it), on the target's greedy responses to the benchmark prompts instead of held-out training samples.

Compare it with the bench's acceptance per position to tell a generalisation gap (both low) from an
inference bug (this high, the bench low). A bench step starts where the last one was rejected, so the
bench's first-position rate is somewhat lower than this per-token average even for a correct engine, and
the chain acceptance these accuracies suggest overstates the bench's (scripts/greedy_walk_validation.py
walks the responses as decoding does).

    .venv/bin/python scripts/teacher_forced_accuracy.py mtp gemma-3-270m-mtp [--steps 6]
    .venv/bin/python scripts/teacher_forced_accuracy.py dflash gemma-3-270m-dflash-b8

Uses the plain outputs cached by scripts/context_vocab_accuracy.py (out/plain-outputs.json; made if
missing). Diagnostic only: nothing here is trained on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.drafting.shipped import resolve_drafter
from specdec.training.self_distill import Sample

from context_vocab_accuracy import plain_outputs  # scripts/ is on sys.path when a script here runs

ROOT = Path(__file__).resolve().parents[1]


def objective(method: str, drafter: Path, target, steps: int, context_vocab: bool):
    """The training objective of `drafter` (its shape, weights and vocabulary), for scoring only: `steps`
    draft steps for EAGLE-3 and MTP (Medusa has its heads, DFlash its block)."""
    if method == "eagle3":
        from specdec.training.train_eagle3 import Eagle3Objective, Eagle3TrainOptions

        options = Eagle3TrainOptions(init_from=drafter, ttt_steps=steps, context_vocab=context_vocab)
        return Eagle3Objective(target, [], options, None, 0)
    if method == "medusa":
        from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions

        return MedusaObjective(target, [], MedusaTrainOptions(init_from=drafter, context_vocab=context_vocab), None, 0)
    if method == "mtp":
        from specdec.training.train_mtp import MTPObjective, MTPTrainOptions

        options = MTPTrainOptions(init_from=drafter, steps=steps, context_vocab=context_vocab)
        return MTPObjective(target, [], options, None, 0)
    if method == "dflash":
        from specdec.training.train_dflash import DFlashObjective, DFlashTrainOptions

        options = DFlashTrainOptions(init_from=drafter, num_anchors=1 << 20, context_vocab=context_vocab)
        return DFlashObjective(target, [], options, None, 0)
    raise SystemExit(f"method must be eagle3, medusa, mtp or dflash, got {method!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("method", choices=["eagle3", "medusa", "mtp", "dflash"])
    ap.add_argument("drafter", help="drafter directory or shipped name")
    ap.add_argument("--steps", type=int, default=6, help="eagle3, mtp: draft steps scored")
    ap.add_argument("--static-vocab", action="store_true", help="score the static draft vocabulary only")
    ap.add_argument("--mt-limit", type=int, default=10)
    ap.add_argument("--cache", default=str(ROOT / "out/plain-outputs.json"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    plain = LLM("gemma-3-270m")
    outputs = plain_outputs(plain, Path(args.cache), args.mt_limit)
    obj = objective(args.method, resolve_drafter(args.drafter), plain.model, args.steps, not args.static_vocab)
    obj.model.eval()
    for name, rows in outputs.items():
        correct: list[int] = []
        counted: list[int] = []
        with torch.no_grad():
            for i, r in enumerate(rows):
                _, m = obj.loss(Sample(f"{name}-{i}", r["category"], r["prompt"], r["response"]))
                correct = [a + b for a, b in zip(correct, m.correct)] if correct else list(m.correct)
                counted = [a + b for a, b in zip(counted, m.counted)] if counted else list(m.counted)
        acc = ", ".join(f"{c / n:.3f}" if n else "-" for c, n in zip(correct, counted))
        print(f"{name:12s} accuracy per step: {acc}   (scored: {', '.join(map(str, counted))})", flush=True)


if __name__ == "__main__":
    main()
