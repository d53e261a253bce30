"""Before/after of the bf16 linears' kernel (`rows_linear`) in one process: this CPU's best build of the bf16
kernels from another commit (or folder) and from this checkout, called in turn on the same inputs, and whether
both give the same bits. A call set is every linear of one decode step of Gemma 3 270M (18 layers x qkv 1536 x
640, o 640 x 1024, gate_up 4096 x 640, down 640 x 2048), distinct weights so that they stream from memory as
in decoding; medians of `--repeats` alternations. Only such interleaved timings compare two kernels on a
machine whose speed drifts from minute to minute.

    .venv/bin/python scripts/rows_linear_ab.py --before 7ab3c94 --rows 1,4,8,12,16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attention_kernel_ab import add_build_options, before_and_after

LAYERS = 18
SHAPES = ((1536, 640), (640, 1024), (4096, 640), (640, 2048))  # (out, in) features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_build_options(ap)
    ap.add_argument("--rows", default="1,4,8,16", help="comma-separated row counts")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    modules = before_and_after(args)
    g = torch.Generator().manual_seed(0)
    weights = [[(torch.randn(n, k, generator=g) * 0.05).bfloat16() for n, k in SHAPES] for _ in range(LAYERS)]
    print(f"{'rows':>4} {'before ms':>10} {'after ms':>9} {'after/before':>12}  same bits")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in {k for _, k in SHAPES}}
        same = all(torch.equal(modules[0].rows_linear(xs[w.shape[1]], w), modules[1].rows_linear(xs[w.shape[1]], w))
                   for w in weights[0])
        times: list[list[float]] = [[], []]
        for _ in range(args.repeats):
            for i, module in enumerate(modules):
                start = time.perf_counter()
                for layer in weights:
                    for w in layer:
                        module.rows_linear(xs[w.shape[1]], w)
                times[i].append((time.perf_counter() - start) * 1e3)
        b, a = statistics.median(times[0]), statistics.median(times[1])
        print(f"{rows:>4} {b:>10.2f} {a:>9.2f} {a / b:>11.3f}x  {same}", flush=True)


if __name__ == "__main__":
    main()
