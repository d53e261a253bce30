"""Rows-vs-time of the linear kernels on the default model's shapes: the LM head (262144 x 640), and the 18
layers' four linears together (qkv 1536 x 640, o 640 x 1024, gate_up 4096 x 640, down 640 x 2048), for bf16
(our row kernel), int8 (s8: also the GGUF's Q8_0 / Q5_0 path) and int4 (u4: also Q4_K), at 1-64 rows.
Random weights (the speed does not depend on the values). Writes a JSON report and prints a table.

    .venv/bin/python scripts/quant_kernel_rows.py --threads 2 --output benchmarks/results/quantized/kernel_rows.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.models.fast_linear import linear_float
from specdec.quantization.quantized_weight import QuantizedWeight
from specdec.quantization.weight_quantizers import quantize_int4, quantize_int8

ROWS = (1, 2, 4, 8, 16, 32, 64)
LAYER_SHAPES = ((1536, 640), (640, 1024), (4096, 640), (640, 2048))


def timed(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = {"head": [torch.randn(262144, 640) * 0.05],
             "layers": [torch.randn(n, k) * 0.05 for _ in range(18) for n, k in LAYER_SHAPES]}
    kinds = {
        "bf16": {g: [w.bfloat16() for w in ws] for g, ws in dense.items()},
        "int8": {g: [QuantizedWeight(quantize_int8(w), w.shape[1], "int8") for w in ws] for g, ws in dense.items()},
        "int4": {g: [QuantizedWeight(quantize_int4(w, 0), w.shape[1], "int4") for w in ws] for g, ws in dense.items()},
    }
    del dense
    results = []
    for group in ("head", "layers"):
        for m in ROWS:
            row = {"matrices": group, "rows": m}
            for kind, weights in kinds.items():
                ws = weights[group]
                xs = {k: torch.randn(m, k).bfloat16() for k in {w.shape[1] for w in ws}}
                if kind == "bf16":
                    fn = lambda: [linear_float(xs[w.shape[1]], w) for w in ws]  # noqa: E731
                else:
                    fn = lambda: [w.linear_float(xs[w.in_features]) for w in ws]  # noqa: E731
                row[f"{kind}_ms"] = timed(fn, 5 if group == "head" else 3)
            results.append(row)
            print(group, m, " ".join(f"{k}: {row[f'{k}_ms']:7.2f} ms" for k in kinds), flush=True)
    for group in ("head", "layers"):
        one = next(r for r in results if r["matrices"] == group and r["rows"] == 1)
        for r in results:
            if r["matrices"] == group:
                for kind in kinds:
                    r[f"{kind}_vs_1_row"] = r[f"{kind}_ms"] / one[f"{kind}_ms"]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"threads": args.threads, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
