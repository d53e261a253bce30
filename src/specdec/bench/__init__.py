"""Side-by-side benchmark: plain and speculative decoding on the same prompts, in one process.

prompts.py (jsonl loading, turn rendering), runner.py (the interleaved timing loop), divergence.py
(first divergence, target's logit margin), transformers_rows.py and llama_cpp_rows.py (peer libraries' rows),
report.py (aggregates, JSON), table.py (rich tables), command.py (`specdec bench`).
"""

from typing import Any

__all__ = ["run_bench"]


def __getattr__(name: str) -> Any:
    # Lazy, so that building the CLI parser (which imports bench.command) does not import torch.
    if name == "run_bench":
        from specdec.bench.runner import run_bench

        return run_bench
    raise AttributeError(name)
