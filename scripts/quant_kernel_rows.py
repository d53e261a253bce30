"""Rows-vs-time of the linear kernels on the default model's shapes: the LM head (262144 x 640), and the 18
layers' four linears together (qkv 1536 x 640, o 640 x 1024, gate_up 4096 x 640, down 640 x 2048), for bf16
(our row kernel), int8 (s8: also the GGUF's Q8_0 / Q5_0 path), int4 (u4r: int8 activations per row),
w8a8_int8 (s8r: int8 activations per row) and q4_1 (u4, x per block of 32: the GGUF's Q4_K path, and `int4`
before its integer group scales), at 1-64 rows.
Random weights (the speed does not depend on the values). Writes a JSON report and prints a table.
--quant-isa avx512_vnni (or avx2) times that build on a CPU that has a better one (before/after in one session);
--kinds and --rows shorten a run; --repeat keeps each cell's best of several timings.

    .venv/bin/python scripts/quant_kernel_rows.py --threads 2 --output benchmarks/results/quantized/kernel_rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from specdec.models import fast_linear
from specdec.models.fast_linear import linear_float
from specdec.quantization.kernel import quant_kernel_isa
from specdec.quantization.quantized_weight import QuantizedWeight
from specdec.quantization.weight_quantizers import quantize_q4_1, quantize_int4, quantize_int8, quantize_w8a8

ROWS = (1, 2, 4, 8, 16, 32, 64)
LAYER_SHAPES = ((1536, 640), (640, 1024), (4096, 640), (640, 2048))


def timed(fn, reps: int, repeat: int = 1) -> float:
    """ms per call: the mean of `reps` calls, the best of `repeat` such runs (the machine is shared)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps * 1e3)
    return best


def bf16_as_the_model_keeps_it(w: torch.Tensor, head: bool) -> torch.Tensor:
    """The bf16 weight with the packed copy the decoder keeps (fast_linear.pack_weight: the layers on every build
    with such a layout, the LM head where it is packed too, packed_head.py), so linear_float times what decoding
    runs."""
    w = w.bfloat16()
    kernel = fast_linear.kernel()
    if not head or (kernel is not None and hasattr(kernel, "packed_rows_linear")):
        fast_linear.pack_weight(w)
    return w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    parser.add_argument("--kinds", default="bf16,int8,int4", help="comma-separated subset of bf16,int8,int4,w8a8_int8,q4_1")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    parser.add_argument("--repeat", type=int, default=1, help="time each cell this many times, keep the best")
    parser.add_argument("--quant-isa", choices=("auto", "avx512_vnni", "avx2"), default="auto",
                        help="avx512_vnni: time the VNNI build where the AMX-INT8 one would run (SPECDEC_NO_AMX=1); "
                             "avx2: the AVX2 build where an AVX512 one would (SPECDEC_NO_VNNI=1)")
    args = parser.parse_args()
    if args.quant_isa == "avx512_vnni":
        os.environ["SPECDEC_NO_AMX"] = "1"
    if args.quant_isa == "avx2":
        os.environ["SPECDEC_NO_VNNI"] = "1"
    wanted = args.kinds.split(",")
    rows = [int(r) for r in args.rows.split(",")]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = {"head": [torch.randn(262144, 640) * 0.05],
             "layers": [torch.randn(n, k) * 0.05 for _ in range(18) for n, k in LAYER_SHAPES]}
    makers = {
        "bf16": lambda w: bf16_as_the_model_keeps_it(w, head=w.shape[0] == 262144),
        "int8": lambda w: QuantizedWeight(quantize_int8(w), w.shape[1], "int8"),
        "int4": lambda w: QuantizedWeight(quantize_int4(w, 0), w.shape[1], "int4"),
        "w8a8_int8": lambda w: QuantizedWeight(quantize_w8a8(w), w.shape[1], "w8a8_int8"),
        "q4_1": lambda w: QuantizedWeight(quantize_q4_1(w, 0), w.shape[1], "q4_1"),
    }
    kinds = {kind: {g: [makers[kind](w) for w in ws] for g, ws in dense.items()} for kind in wanted}
    del dense
    print("quantized kernel:", quant_kernel_isa(), flush=True)
    results = []
    for group in ("head", "layers"):
        for m in rows:
            row = {"matrices": group, "rows": m}
            for kind, weights in kinds.items():
                ws = weights[group]
                xs = {k: torch.randn(m, k).bfloat16() for k in {w.shape[1] for w in ws}}
                if kind == "bf16":
                    fn = lambda: [linear_float(xs[w.shape[1]], w) for w in ws]  # noqa: E731
                else:
                    fn = lambda: [w.linear_float(xs[w.in_features]) for w in ws]  # noqa: E731
                row[f"{kind}_ms"] = timed(fn, 5 if group == "head" else 3, args.repeat)
            results.append(row)
            print(group, m, " ".join(f"{k}: {row[f'{k}_ms']:7.2f} ms" for k in kinds), flush=True)
    for group in ("head", "layers"):
        one = next((r for r in results if r["matrices"] == group and r["rows"] == 1), None)
        if one is None:
            continue
        for r in results:
            if r["matrices"] == group:
                for kind in kinds:
                    r[f"{kind}_vs_1_row"] = r[f"{kind}_ms"] / one[f"{kind}_ms"]
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        report = {"threads": args.threads, "quant_isa": quant_kernel_isa(), "repeat": args.repeat, "rows": results}
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
