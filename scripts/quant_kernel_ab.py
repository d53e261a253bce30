"""Before/after of the quantized-linear kernel in one process: one build (by default this CPU's best, e.g. the
AMX-INT8 one) from another commit's kernels (or folder) and from this checkout, called in turn on the same
weights and inputs of one kind (--kind: int4 by default; int8 is also the GGUF's Q8_0 path, q4_1 its Q4_K one)
on the default model's LM head, 262144 x 640, and the 18 layers' four linears, the
median of 7 alternated timings per cell, and whether both builds give the same bits. On a machine whose
speed drifts by tens of percent from minute to minute, only such interleaved timings compare two kernels.

    .venv/bin/python scripts/quant_kernel_ab.py --before 2df1d98 --rows 1,8,16,32 [--kind q4_1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

from quant_kernel_rows import LAYER_SHAPES  # the default model's layer linears, as the rows table times them

KERNELS = Path("src/specdec/models/kernels")


def kernels_at(rev: str, into: Path) -> Path:
    """The kernels folder of commit `rev`, extracted under `into`."""
    data = subprocess.run(["git", "archive", rev, str(KERNELS)], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / KERNELS


def build(folder: Path, isa: str):
    """The quant kernel's `isa` build from `folder` (named by its contents' hash, so builds never mix)."""
    from specdec.models.fast_linear import load_extension
    from specdec.quantization import kernel as kq

    name, source, _, _, extra = kq.QUANT_BUILDS[isa]
    module = load_extension(name, [source], kq._AVX2_FLAGS + list(extra), f"the quant kernel in {folder}", folder)
    if module is None:
        raise SystemExit(f"could not build the {isa} quant kernel from {folder}")
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a commit (its kernels folder) or a kernels folder")
    ap.add_argument("--rows", default="1,8,16,32", help="comma-separated row counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None, help="the build to compare (amx_int8, avx512_vnni, avx2); by default "
                    "this CPU's best, the one whose tile width the weights are packed for")
    ap.add_argument("--kind", default="int4", choices=("int4", "int8", "q4_1", "w8a8_int8"), help="the weights' kind")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from specdec.quantization.kernel import quant_isas
    from specdec.quantization.quantized_weight import QuantizedWeight
    from specdec.quantization.weight_quantizers import quantize_int4, quantize_int8, quantize_q4_1, quantize_w8a8

    isa = args.isa or quant_isas()[0]
    print(f"build: {isa}, kind: {args.kind}")

    with tempfile.TemporaryDirectory() as tmp:
        before = Path(args.before) if Path(args.before).is_dir() else kernels_at(args.before, Path(tmp))
        modules = [build(before, isa), build(KERNELS, isa)]
    g = torch.Generator().manual_seed(0)
    quantizers = {"int4": quantize_int4, "int8": quantize_int8, "q4_1": quantize_q4_1, "w8a8_int8": quantize_w8a8}
    quantize = quantizers[args.kind]
    head = QuantizedWeight(quantize(torch.randn(262144, 640, generator=g) * 0.05), 640, args.kind)
    layers = [QuantizedWeight(quantize(torch.randn(n, k, generator=g) * 0.05), k, args.kind) for n, k in LAYER_SHAPES]
    print(f"{'matrices':8} {'rows':>4} {'before ms':>10} {'after ms':>9} {'after/before':>12}  same bits")
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in (640, 1024, 2048)}
        for label, weights, reps in (("head", [head], 5), ("layers", layers * 18, 3)):
            def call(module, ws=weights):
                return [module.quant_linear(xs[w.in_features], *w._tiles, w._kind_id, True) for w in ws]
            same = all(torch.equal(a, b) for a, b in zip(call(modules[0], weights[:4]), call(modules[1], weights[:4])))
            times: list[list[float]] = [[], []]
            for _ in range(7):
                for i, module in enumerate(modules):
                    start = time.perf_counter()
                    for _ in range(reps):
                        call(module)
                    times[i].append((time.perf_counter() - start) / reps * 1e3)
            b, a = statistics.median(times[0]), statistics.median(times[1])
            print(f"{label:8} {m:4d} {b:10.2f} {a:9.2f} {a / b:12.3f}  {same}", flush=True)


if __name__ == "__main__":
    main()
