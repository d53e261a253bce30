"""Before/after of one layer's attention call (`attention_batch`) in one process: the bf16 kernels' build (by
default this CPU's best) from another commit's kernels (or folder) and from this checkout, called in turn on
the same inputs (Gemma 3 270M's shape: 4 query heads on 1 KV head of 256 dims, a chain of `rows` new tokens
after `context` cached ones, a global layer or a 512-slot window), the best of 15 alternated timings per cell,
and whether both builds give the same bits. Only such interleaved timings compare two kernels on a machine
whose speed drifts from minute to minute.

    .venv/bin/python scripts/attention_kernel_ab.py --before 924adef --cases 3500:1:global,3500:8:global,600:8:512
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from quant_kernel_ab import KERNELS, kernels_at

HEADS, DIM = 4, 256


def build(folder: Path, isa: str):
    """The bf16 kernels' `isa` build from `folder` (named by its contents' hash, so builds never mix)."""
    from specdec.models import fast_linear

    name, sources, cflags = fast_linear._BUILDS[isa]
    module = fast_linear.load_extension(name, sources, cflags, f"the bf16 kernels in {folder}", folder)
    if module is None:
        raise SystemExit(f"could not build the {isa} kernels from {folder}")
    return module


def inputs(context: int, rows: int, window: int, g: torch.Generator) -> tuple:
    """attention_batch's arguments for one sequence: a chain of `rows` tokens after `context` cached slots."""
    capacity = context + 64
    q = torch.randn(rows, HEADS, DIM, generator=g).bfloat16()
    k, v = (torch.randn(rows, 1, DIM, generator=g).bfloat16() for _ in range(2))
    keys_t = torch.randn(1, DIM, capacity, generator=g).bfloat16()
    values = torch.randn(1, capacity, DIM, generator=g).bfloat16()
    return (q, k, v, [keys_t], [values], [torch.empty(0)], [torch.empty(0, dtype=torch.long)], [0], [rows],
            [context], torch.arange(context, context + rows), window, DIM**-0.5, [torch.empty(0)], [torch.empty(0)])


def add_build_options(ap: argparse.ArgumentParser) -> None:
    """--before, --threads and --isa, as before_and_after reads them."""
    ap.add_argument("--before", required=True, help="a commit (its kernels folder) or a kernels folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None, help="amx, avx512_bf16 or avx2; by default this CPU's best")


def before_and_after(args: argparse.Namespace) -> list:
    """The bf16 kernels' builds of --before and of this checkout (torch set to --threads threads)."""
    torch.set_num_threads(args.threads)

    from specdec.models import fast_linear

    isa = args.isa or fast_linear._isas()[0]
    print(f"build: {isa}")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(args.before) if Path(args.before).is_dir() else kernels_at(args.before, Path(tmp))
        return [build(before, isa), build(KERNELS, isa)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_build_options(ap)
    ap.add_argument("--cases", default="3500:1:global,3500:8:global,3500:16:global,3500:8:512,600:1:512,600:8:512",
                    help="comma-separated context:rows:window (window: global or a slot count)")
    args = ap.parse_args()
    modules = before_and_after(args)
    g = torch.Generator().manual_seed(0)
    print(f"{'context':>7} {'rows':>4} {'window':>6} {'before us':>10} {'after us':>9} {'before/after':>12}  same bits")
    for case in args.cases.split(","):
        context, rows, window = case.split(":")
        w = -1 if window == "global" else int(window)
        call = inputs(int(context), int(rows), w, g)
        same = torch.equal(modules[0].attention_batch(*call), modules[1].attention_batch(*call))
        reps = max(20, 20_000 // (int(context) * int(rows)) * 10)
        times: list[list[float]] = [[], []]
        for _ in range(15):
            for i, module in enumerate(modules):
                start = time.perf_counter()
                for _ in range(reps):
                    module.attention_batch(*call)
                times[i].append((time.perf_counter() - start) / reps * 1e6)
        b, a = min(times[0]), min(times[1])
        print(f"{context:>7} {rows:>4} {window:>6} {b:>10.1f} {a:>9.1f} {b / a:>11.2f}x  {same}", flush=True)


if __name__ == "__main__":
    main()
