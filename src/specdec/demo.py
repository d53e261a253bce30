"""`specdec demo`: plain and speculative decoding side by side on a few prompts, on the default model."""

from __future__ import annotations

import argparse
import time

from specdec.defaults import DEFAULT_MODEL

DEMO_PROMPTS = [
    "Question: Summarize the following text in two sentences.\n"
    "The city council met on Tuesday to discuss the new library. The new library will have three floors, "
    "a children's section, a cafe and a rooftop garden. The council said the new library will open next spring, "
    "and that the old library will stay open until the new library is ready.\nAnswer:",
    "Question: What are the three primary colors? Explain each one.\nAnswer:",
    "Question: Translate to English: 'Ich habe keine Zeit, weil ich arbeiten muss.'\nAnswer:",
    "Question: Write a Python function that returns the sum of a list of numbers.\nAnswer:",
]
NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
# The fastest method measured on the default model (scripts/bench_held_out.sh): prompt lookup where the
# context repeats itself, the shipped EAGLE-3 drafter elsewhere. Other models get lookup alone.
DEFAULT_MODEL_CONFIG = {"method": "hybrid", "num_speculative_tokens": 7, "prompt_lookup_min": 3, "fallback": {
    "method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 6, "confidence_threshold": 0.6}}
# Where the bf16 linears run on AMX tiles, 16 verification rows cost about one: lookup drafts of 15 and
# EAGLE-3's dynamic tree (depth 10, 15 nodes: one tile of rows with the root). On a 2-core Xeon, one run per
# prompt set (2026-12-05, runs hybrid-lookup15 and hybrid-lookup15-tree): lookup 15 beat 7 by 17% on held_out
# and other_kinds, and the tree fallback the chain by 2% and 4%. Elsewhere (AVX2, AVX512-BF16) the row kernel
# works in blocks of four rows, 8 rows cost about what 6 do, and 7 with the chain measured best (hybrid-k7).
AMX_CONFIG = {"method": "hybrid", "num_speculative_tokens": 15, "prompt_lookup_min": 3, "fallback": {
    "method": "eagle3", "model": "gemma-3-270m-eagle3", "num_speculative_tokens": 10, "tree_top_k": 3,
    "tree_num_draft_tokens": 15, "confidence_threshold": 0.1}}


def demo_config(model: str, device: str | None = "cpu") -> dict:
    """The demo's speculative_config for `model` on `device` of this machine (a GPU's rows: the portable one)."""
    if model != DEFAULT_MODEL:
        return NGRAM_CONFIG
    from specdec.drafting.proposal_settings import runs_on_cpu
    from specdec.models import fast_linear

    return AMX_CONFIG if fast_linear.kernel_isa() == "amx" and runs_on_cpu(device) else DEFAULT_MODEL_CONFIG


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="plain vs speculative decoding on a few prompts (the default model)")
    demo.add_argument("--model", default=DEFAULT_MODEL)
    demo.add_argument("--max-tokens", type=int, default=128)
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specdec.api import LLM
    from specdec.sampling_params import SamplingParams

    import sys

    console = Console(width=None if sys.stdout.isatty() else 110)
    console.print(f"[bold]loading {args.model}[/bold] (the first run converts the GGUF file once, ~40 s)")
    plain = LLM(model=args.model)
    config = demo_config(args.model, str(plain.model.device))
    spec = LLM(loaded=plain.model, speculative_config=config)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    plain.generate(DEMO_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    spec.generate(DEMO_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8))
    table = Table(title=f"{args.model}, bfloat16, greedy, {args.max_tokens} new tokens; speculative: {config}")
    table.add_column("prompt", no_wrap=True, max_width=26)
    for col in ("plain tok/s", "spec tok/s", "speedup", "acc. rate", "mean acc. len", "identical"):
        table.add_column(col, justify="right", no_wrap=True)
    total_plain = total_spec = 0.0
    all_identical = True
    for prompt in DEMO_PROMPTS:
        t0 = time.perf_counter()
        base = plain.generate(prompt, params)[0]
        t1 = time.perf_counter()
        out = spec.generate(prompt, params)[0]
        t2 = time.perf_counter()
        total_plain += t1 - t0
        total_spec += t2 - t1
        identical = base.outputs[0].token_ids == out.outputs[0].token_ids
        all_identical &= identical
        stats = out.spec_decoding_stats
        n = len(out.outputs[0].token_ids)
        console.rule(prompt.splitlines()[0][:80])
        console.print(out.outputs[0].text.strip(), markup=False)
        table.add_row(
            prompt.splitlines()[0].removeprefix("Question: ")[:26], f"{n / (t1 - t0):.1f}", f"{n / (t2 - t1):.1f}",
            f"{(t1 - t0) / (t2 - t1):.2f}x", f"{stats.acceptance_rate:.2f}", f"{stats.mean_acceptance_length:.2f}",
            "yes" if identical else "NO",
        )
    console.print(table)
    console.print(
        f"overall speedup {total_plain / total_spec:.2f}x (plain {total_plain:.2f} s, speculative {total_spec:.2f} s); "
        f"outputs identical to plain decoding: {'all' if all_identical else 'NOT ALL'}"
    )
    return 0 if all_identical else 1
