"""Is each shipped drafter's bare config within 5% of the best configuration of the same run, and no slowdown?

    .venv/bin/python scripts/check_defaults.py benchmarks/results/methods-table-other_kinds.json

Reads a `specdec bench` report whose configs list each drafter's bare `{"method", "model"}` config before its
other configurations (scripts/bench_methods_table.sh): the first run of each (method, model) is the bare one.
Prints one line per drafter and exits 1 if any bare config is more than 5% behind its best or below 1.00x.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOLERANCE = 0.95


def main(path: str) -> int:
    runs = json.loads(Path(path).read_text())["runs"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        model = run["speculative_config"].get("model")
        if run["method"] in ("ngram", "hybrid", "draft_model") or model is None:
            continue
        groups.setdefault((run["method"], model), []).append(run)
    failed = False
    for (method, model), group in groups.items():
        bare, best = group[0], max(group, key=lambda r: r["overall"]["speedup"])
        ratio = bare["overall"]["speedup"] / best["overall"]["speedup"]
        ok = ratio >= TOLERANCE and bare["overall"]["speedup"] >= 1.0
        failed |= not ok
        settings = {k: v for k, v in best["speculative_config"].items() if k not in ("method", "model")}
        print(f"{'ok  ' if ok else 'FAIL'} {method} {model}: bare {bare['overall']['speedup']:.2f}x "
              f"(acceptance length {bare['overall']['mean_acceptance_length']:.2f}), best of {len(group)} "
              f"{best['overall']['speedup']:.2f}x, bare/best {ratio:.3f}; best settings {json.dumps(settings)}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1]))
