#!/usr/bin/env python3
"""Builds the case set `specdec check` ships (src/specdec/check/cases.jsonl.gz) from the training corpora.

    .venv/bin/python scripts/make_check_cases.py [--per-kind 8] [--long 4] [--seed 0]

Cases come from `build_prompts(long=True)` over ../shared/data/train, which skips every held-out benchmark
item and never reads ../shared/data/eval. Per kind, the first prompts of build_prompts' (seeded, shuffled)
order whose rendered prompt fits the token budget; then a few long-context prompts (one per long source,
round robin) of 1k-2.5k tokens, few because each costs seconds of prefill per mode. The output is
deterministic for a given seed and corpora (gzip without a timestamp).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from specdec.bench.prompts import render_prompt
from specdec.check.cases import CASES_PATH, KINDS, LONG_KIND
from specdec.models.loading import load_tokenizer
from specdec.training.prompt_sources import TrainPrompt, build_prompts

MAX_SHORT_TOKENS = 768  # the short kinds reach ~750 tokens (summaries, arena prompts); more only costs time
LONG_TOKENS = (1000, 2500)  # long context, kept under 2.5k so the default run stays within ~10 minutes


def _source(p: TrainPrompt) -> str:
    return p.id.split("-", 1)[0]


def select(prompts: list[TrainPrompt], tokenizer: object, per_kind: int, num_long: int) -> list[dict]:
    def tokens(p: TrainPrompt) -> int:
        return len(render_prompt(tokenizer, p.turns, p.answers))

    cases: list[dict] = []
    for kind in KINDS:
        if kind == LONG_KIND:
            continue
        mine = [p for p in prompts if p.kind == kind and not _source(p).startswith("long")]
        chosen = [p for p in mine if tokens(p) <= MAX_SHORT_TOKENS][:per_kind]
        if len(chosen) < per_kind:
            raise SystemExit(f"only {len(chosen)} {kind} prompts fit {MAX_SHORT_TOKENS} tokens")
        cases += [_case(p, kind) for p in chosen]
    by_source: dict[str, list[TrainPrompt]] = {}
    for p in prompts:
        if _source(p).startswith("long") and LONG_TOKENS[0] <= tokens(p) <= LONG_TOKENS[1]:
            by_source.setdefault(_source(p), []).append(p)
    longs = [p for group in zip(*(by_source[s] for s in sorted(by_source))) for p in group][:num_long]
    if len(longs) < num_long:
        raise SystemExit(f"only {len(longs)} long prompts of {LONG_TOKENS} tokens")
    return cases + [_case(p, LONG_KIND) for p in longs]


def _case(p: TrainPrompt, kind: str) -> dict:
    case = {"id": p.id, "kind": kind, "turns": list(p.turns)}
    if p.answers:
        case["answers"] = list(p.answers)
    return case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=8, help="cases per short kind (default 8)")
    ap.add_argument("--long", type=int, default=4, help="long-context cases (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="build_prompts' seed (default 0)")
    ap.add_argument("--output", type=Path, default=CASES_PATH)
    args = ap.parse_args()
    cases = select(build_prompts(seed=args.seed, long=True), load_tokenizer(), args.per_kind, args.long)
    text = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    with open(args.output, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))
    kinds = {k: sum(c["kind"] == k for c in cases) for k in KINDS}
    print(f"{len(cases)} cases written to {args.output}: {kinds}")


if __name__ == "__main__":
    main()
