"""`specdec check`: the lossless regression gate. Exit 0: every check passed; 1: one failed; 2: a user error."""

from __future__ import annotations

import argparse
import json
import sys

EXIT_FAILED = 1

DESCRIPTION = """\
Runs the shipped cases (chat, writing, code, math, summarization, translation, QA, RAG, long context; taken
from the training corpora, never the eval sets) with plain decoding and each speculative config, greedy and
batched, and fails (exit 1) when:
  - a speculative output differs from the plain one (printed: case, first differing position, the target's
    top-2 logit margin there, the text before it);
  - seeded temperature-1 samples of a few continuations do not fit the target's exact probabilities
    (chi-square p below --alpha);
  - the acceptance rate (accepted / drafted tokens) is below --min-acceptance, or the speedup (plain wall
    time / speculative wall time, same run) below --min-speedup.
Exit 0 when everything passes, 2 on a user error."""


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    from specdec.check.settings import CheckSettings
    from specdec.cli import add_model_args

    d = CheckSettings()
    p = sub.add_parser("check", help="lossless regression gate: greedy identity, sampling fit, acceptance floor",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)  # --speculative-config: one JSON object or a list; default ngram with "auto" length
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"default {d.max_new_tokens}")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help=f"sequences running at once, both modes (default {d.batch_size})")
    p.add_argument("--min-acceptance", type=float, default=d.min_acceptance,
                   help=f"fail below this acceptance rate (default {d.min_acceptance})")
    p.add_argument("--min-speedup", type=float, default=None, help="fail below this speedup (default: no floor)")
    p.add_argument("--cases", default=None, help="jsonl(.gz) of cases {id, kind, turns[, answers]} (default: shipped)")
    p.add_argument("--limit", type=int, default=None, help="first N cases (after --kinds)")
    p.add_argument("--kinds", default=None, help="comma-separated kinds to keep, e.g. code,math")
    p.add_argument("--sampling-cases", type=int, default=d.sampling_cases,
                   help=f"cases continued by sampling (default {d.sampling_cases}; 0 skips the sampling check)")
    p.add_argument("--samples", type=int, default=d.samples, help=f"samples per sampling case (default {d.samples})")
    p.add_argument("--sampling-tokens", type=int, default=d.sampling_tokens,
                   help=f"tokens per sample (default {d.sampling_tokens})")
    p.add_argument("--alpha", type=float, default=d.alpha,
                   help=f"sampling check's significance level (default {d.alpha})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"first sampling seed (default {d.seed})")
    p.add_argument("--output-json", default=None, help="write the JSON report here")
    p.add_argument("--output-md", default=None, help="write the Markdown report here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_check)


def parse_configs(text: str | None) -> list:
    """--speculative-config as `specdec bench` reads it: one JSON object or a list of them."""
    from specdec.check.settings import DEFAULT_CONFIG
    from specdec.cli import parse_speculative_config

    if text is None:
        return [parse_speculative_config(json.dumps(DEFAULT_CONFIG))]
    if text.lstrip().startswith("["):
        items = json.loads(text)
        if not items:
            raise ValueError("--speculative-config: an empty list")
        return [parse_speculative_config(json.dumps(c)) for c in items]
    return [parse_speculative_config(text)]


def cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from specdec.check.gate import run_check
    from specdec.check.settings import CheckSettings
    from specdec.check.report import print_report, write_reports

    settings = CheckSettings(
        model=args.model, dtype=args.dtype, device=args.device, quantization=args.quantization,
        configs=parse_configs(args.speculative_config), cases=args.cases, limit=args.limit,
        kinds=[k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, min_acceptance=args.min_acceptance,
        min_speedup=args.min_speedup, sampling_cases=args.sampling_cases, samples=args.samples,
        sampling_tokens=args.sampling_tokens, alpha=args.alpha, seed=args.seed, progress=not args.no_progress,
    )
    report = run_check(settings)
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    print_report(report, console)
    write_reports(report, args.output_json, args.output_md)
    return 0 if report["passed"] else EXIT_FAILED
