"""The AVX2 linears on their lane-panel copies (`lane_panel_linear`, what the decoder runs for 5 rows and
more) against `rows_linear` on the weights themselves, in one process on this checkout's kernels: alternated
medians over every linear of one decode step of Gemma 3 270M (18 layers x qkv 1536 x 640, o 640 x 1024,
gate_up 4096 x 640, down 640 x 2048, distinct weights so that they stream from memory), and whether both give
the same bits.

    .venv/bin/python scripts/lane_panels_ab.py --rows 5,6,8,12,16,32,64 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rows_linear_ab import LAYERS, SHAPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="5,8,16,32")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from specdec.models import fast_linear

    kern = fast_linear.kernel()
    if kern is None or not hasattr(kern, "lane_panel_linear"):
        raise SystemExit(f"no lane panels in this CPU's kernels ({fast_linear.kernel_isa()}): they are the AVX2 build's")
    g = torch.Generator().manual_seed(0)
    weights = [[(torch.randn(n, k, generator=g) * 0.05).bfloat16() for n, k in SHAPES] for _ in range(LAYERS)]
    packed = [[kern.lane_panel_pack(w) for w in layer] for layer in weights]
    print(f"{'rows':>4} {'rows_linear ms':>14} {'lane panels ms':>14} {'panels/rows':>11}  same bits")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in {k for _, k in SHAPES}}
        same = all(torch.equal(kern.rows_linear(xs[w.shape[1]], w), kern.lane_panel_linear(xs[w.shape[1]], w, p))
                   for w, p in zip(weights[0], packed[0]))
        times: list[list[float]] = [[], []]
        for _ in range(args.repeats):
            start = time.perf_counter()
            for layer in weights:
                for w in layer:
                    kern.rows_linear(xs[w.shape[1]], w)
            times[0].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            for layer, packs in zip(weights, packed):
                for w, p in zip(layer, packs):
                    kern.lane_panel_linear(xs[w.shape[1]], w, p)
            times[1].append((time.perf_counter() - start) * 1e3)
        a, b = statistics.median(times[0]), statistics.median(times[1])
        print(f"{rows:>4} {a:>14.2f} {b:>14.2f} {b / a:>10.3f}x  {same}", flush=True)


if __name__ == "__main__":
    main()
