"""`specdec bench` (placeholder until the benchmark lands)."""

from __future__ import annotations

import argparse


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="plain vs speculative decoding on a prompt file")
    bench.set_defaults(func=lambda args: 1)
