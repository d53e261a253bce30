"""The target's batched forward cost on this machine: ms per forward for B sequences of k+1 rows each.

    .venv/bin/python scripts/step_cost_table.py --batch-sizes 1,4,16,32 --draft-lengths 0,5
    .venv/bin/python scripts/step_cost_table.py --batch-sizes 1 --draft-lengths 0,7,15 --quantization int4 --threads 2

Each sequence has a `--context`-token prefix (a sample sentence repeated) in a cache of max(512, context + 64) slots; a forward runs its
k+1 new rows (k = 0 is a plain decode step), and is rolled back after. Best of `--repeats` after one warm-up. Also prints plain
decoding's throughput ratio against B=1 (what batching can give before speculation).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdec.defaults import DEFAULT_MODEL
from specdec.models.loading import load_model
from specdec.models.runtime import ForwardCall, forward_batch
from specdec.scheduling.cost_curve import sample_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--batch-sizes", default="1,4,16,32")
    ap.add_argument("--draft-lengths", default="0,5")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quantization", default=None, help="int8, int4 or gguf (default: the dense weights)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    ap.add_argument("--output", default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, quantization=args.quantization)
    # rows the model predicts confidently, as in real decoding (cost_curve.SAMPLE_TEXT)
    text = sample_tokens(model.tokenizer) or list(range(1, 101))
    table: dict[str, dict[str, float]] = {}
    print(f"{'B':>3} " + " ".join(f"{'k=' + k:>9}" for k in args.draft_lengths.split(",")) + "  plain x B=1")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        runtimes = [model.new_runtime() for _ in range(b)]
        for i, rt in enumerate(runtimes):
            rt.reset(max(512, args.context + 64))
            rt.prefill([text[(i * 7 + j) % len(text)] for j in range(args.context)])
        row = {}
        for k in (int(x) for x in args.draft_lengths.split(",")):
            times = []
            for _ in range(args.repeats + 1):
                t = time.perf_counter()
                with torch.inference_mode():
                    forward_batch(runtimes, [ForwardCall([text[(i * 7 + j) % len(text)] for j in range(args.context, args.context + k + 1)],
                                                        logit_rows="all", argmax=True, logits=False)
                                            for i in range(b)])  # as greedy steps run, continuing the prefix
                times.append((time.perf_counter() - t) * 1000)
                for rt in runtimes:
                    rt.truncate(args.context)
            row[str(k)] = round(min(times[1:]), 1)
        table[str(b)] = row
        ratio = b * table["1"]["0"] / row["0"] if "1" in table and "0" in row else float("nan")
        print(f"{b:>3} " + " ".join(f"{v:>9.1f}" for v in row.values()) + f"  {ratio:>10.2f}x", flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"context": args.context, "ms_per_forward": table}, f, indent=1)


if __name__ == "__main__":
    main()
