"""`specdec bench`: plain vs speculative decoding on a prompt file, side by side in one process.

    specdec bench --prompts FILE.jsonl [--model M] [--speculative-config JSON] [--dtype D] [--device DEV]
                  [--limit N] [--categories a,b] [--per-category N] [--max-new-tokens 128] [--temperature 0] [--seed 0]
                  [--warmup 1] [--include-transformers] [--include-llama-cpp] [--output FILE.json] [--plot DIR]
    specdec bench --from-report FILE.json [--from-report ...] --plot DIR   (figures from saved reports, no run)

Prompt file: jsonl, MT-Bench lines (question_id, category, turns) or lines with `prompt` (optional
`category`). Every turn is benchmarked as its own generation. Without a chat template the first turn is
rendered as "Question: {turn}\\nAnswer:"; a later turn appends the model's own previous answer (from the
plain run, so both modes see identical prompts) then "\\nQuestion: {turn}\\nAnswer:". With a chat
template, tokenizer.apply_chat_template(messages, add_generation_prompt=True) with the same answers.
A line with `answers` (one per turn but the last) replays those instead and benchmarks its last turn only.

Each prompt runs plain then speculative back to back; speedup = sum of plain seconds / sum of speculative
seconds over the same prompts (the same tokens under greedy decoding). Prints a table, writes the JSON
report with --output, and prints the JSON of `overall` as the last line of stdout. Mismatches are
reported (first divergence, target's logit margin there), never turned into a failing exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP_EPILOG = """\
prompt rendering: every turn is its own generation. Without a chat template the first turn is
"Question: {turn}\\nAnswer:" and each later turn appends the model's previous answer (from the plain
run, so both modes see identical prompts) then "\\nQuestion: {turn}\\nAnswer:". With a chat template:
tokenizer.apply_chat_template(messages, add_generation_prompt=True). A line with "answers" (one per
turn but the last) replays those answers and only its last turn is benchmarked.

speedup = sum of plain seconds / sum of speculative seconds over the same prompts, measured back to back
per prompt. The last line printed is the JSON of the `overall` object.

--plot DIR writes PNGs (bench/plots.py): acceptance per draft position, speedup per category, and tokens/s
against K where several configs differ only in num_speculative_tokens. --from-report FILE.json (repeatable)
draws them from saved reports without running anything.
"""


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from specdec.cli import add_model_args

    bench = sub.add_parser(
        "bench",
        help="plain vs speculative decoding on a prompt file",
        description="Plain and speculative decoding on the same prompts, in one process: speedup, acceptance,\n"
        "token identity (first divergence and the target's logit margin there). Without --speculative-config\n"
        'the speculative side is {"method": "ngram"} with its defaults.',
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--prompts", default=None,
        help="jsonl: MT-Bench lines (question_id, category, turns) or {prompt, category}; "
        "required unless --from-report",
    )
    add_model_args(bench)
    bench.add_argument("--limit", type=int, default=None, help="first N questions (after --categories, --per-category)")
    bench.add_argument(
        "--per-category", type=int, default=None,
        help="first N questions of each category (MT-Bench's file is sorted by category: --limit 10 is writing only)",
    )
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep, e.g. writing,coding")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument(
        "--temperature", type=float, default=0.0,
        help="0 = greedy (default); > 0 samples, identity is then reported but not expected",
    )
    bench.add_argument("--seed", type=int, default=0, help="sampling seed, the same in both modes (default 0)")
    bench.add_argument("--warmup", type=int, default=1, help="prompts run untimed in every mode first (default 1)")
    bench.add_argument(
        "--include-transformers", action="store_true",
        help="add rows for transformers' generate: greedy and prompt lookup (K = num_speculative_tokens)",
    )
    bench.add_argument(
        "--include-llama-cpp", action="store_true",
        help="add rows for llama-cpp-python on the model's GGUF file: greedy and prompt lookup "
        "(K = num_speculative_tokens); batch 1. Its quantized weights match ours with --quantization gguf",
    )
    bench.add_argument(
        "--batch-size", default=None,
        help="comma-separated batch sizes, e.g. 1,4,16,32: offline throughput with every prompt submitted and at "
        "most B running, per B plain and each speculative config (first turns; a PNG plot beside --output)",
    )
    bench.add_argument("--output", default=None, help="write the full JSON report here")
    bench.add_argument("--plot", default=None, metavar="DIR",
                       help="write PNG figures here: acceptance per draft position, speedup per category, "
                       "tokens/s against K (where a K sweep ran)")
    bench.add_argument("--from-report", action="append", default=None, metavar="FILE.json",
                       help="draw --plot's figures from this saved report instead of running (repeatable)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.from_report:
        return _cmd_plot_saved(args)
    if not args.prompts:
        raise ValueError("specdec bench needs --prompts FILE.jsonl (or --from-report FILE.json with --plot DIR)")
    if args.plot and Path(args.plot).exists() and not Path(args.plot).is_dir():
        raise ValueError(f"--plot: {args.plot} exists and is not a directory")

    from specdec.bench.runner import run_bench
    from specdec.bench.table import print_comparison, print_report

    from specdec.cli import parse_speculative_config

    from specdec.bench.quantized import parse_quantizations

    quantizations = parse_quantizations(args.quantization)
    text = args.speculative_config
    several = text is not None and text.lstrip().startswith("[")  # several methods in one run
    # resolved for the (first) target; checked here either way, before any model loads
    if several:
        config = [parse_speculative_config(json.dumps(c), quantizations[0], args.device) for c in json.loads(text)]
    else:
        config = parse_speculative_config(text, quantizations[0], args.device)
    if len(quantizations) > 1 and text is not None:  # each target resolves the dicts for itself (run_bench)
        config = json.loads(text)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    if args.batch_size:
        if args.include_llama_cpp:
            raise ValueError("--include-llama-cpp runs at batch 1 only: drop it or --batch-size")
        if len(quantizations) > 1:
            raise SystemExit("--batch-size takes one --quantization at a time")
        args.quantization = quantizations[0]
        return _cmd_batched(args, config, categories)
    if len(quantizations) > 1:
        return _cmd_quantized(args, config, categories, quantizations)
    report = run_bench(
        args.prompts,
        model=args.model,
        speculative_config=config,
        dtype=args.dtype,
        device=args.device,
        quantization=quantizations[0],
        limit=args.limit,
        categories=categories,
        per_category=args.per_category,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        warmup=args.warmup,
        include_transformers=args.include_transformers,
        include_llama_cpp=args.include_llama_cpp,
        progress=not args.no_progress,
    )
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    if "runs" in report:
        for run in report["runs"]:
            print_report(run, console)
        print_comparison(report["comparison"], console)
    else:
        print_report(report, console)
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {path}")
    _plot(report, "this run", args.plot, console)
    print(json.dumps(report["comparison"] if "runs" in report else report["overall"]), flush=True)
    return 0


def _cmd_quantized(args: argparse.Namespace, config: object, categories: list[str] | None,
                   quantizations: list[str | None]) -> int:
    from rich.console import Console

    from specdec.bench.quantized import print_quantized, run_quantized_bench
    from specdec.bench.table import print_report

    if args.include_transformers:
        raise SystemExit("--include-transformers runs with one --quantization at a time")
    if args.include_llama_cpp:
        raise ValueError("--include-llama-cpp runs with one --quantization at a time (gguf: the same weights)")
    report = run_quantized_bench(
        args.prompts, quantizations, model=args.model, dtype=args.dtype, device=args.device,
        speculative_config=config, limit=args.limit, categories=categories, per_category=args.per_category,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, warmup=args.warmup,
        progress=not args.no_progress)
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 180)
    for target in report["targets"]:
        console.print(f"[bold]target: {target['quantization']}[/bold]")
        for run in target["report"].get("runs", [target["report"]]):
            print_report(run, console)
    print_quantized(report["quantized_comparison"], console)
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {path}")
    _plot(report, "this run", args.plot, console)
    print(json.dumps(report["quantized_comparison"]), flush=True)
    return 0


def _cmd_batched(args: argparse.Namespace, config: object, categories: list[str] | None) -> int:
    from rich.console import Console

    from specdec.bench.batched import plot_batch_bench, print_batch_bench, run_batch_bench

    try:
        sizes = [int(b) for b in args.batch_size.split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"--batch-size takes comma-separated integers, got {args.batch_size!r}") from None
    if args.temperature != 0:
        raise SystemExit("--batch-size runs greedy decoding (its identity check needs it); drop --temperature")
    configs = config if isinstance(config, list) else [config if config is not None else {"method": "ngram"}]
    report = run_batch_bench(
        args.prompts, batch_sizes=sizes, model=args.model, speculative_config=configs, dtype=args.dtype,
        quantization=args.quantization,
        device=args.device, limit=args.limit, categories=categories, per_category=args.per_category,
        max_new_tokens=args.max_new_tokens, warmup=args.warmup, progress=not args.no_progress,
    )
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    print_batch_bench(report, console)
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        plot_batch_bench(report, path.with_suffix(".png"))
        console.print(f"report written to {path} and {path.with_suffix('.png')}")
    _plot(report, "this run", args.plot, console)
    print(json.dumps(report["rows"]), flush=True)
    return 0


def _plot(report: dict, source: str, out_dir: str | None, console: object) -> None:
    """--plot after a run: the figures this report allows."""
    if not out_dir:
        return
    from specdec.bench.plots import runs_of, write_plots

    runs, batched = runs_of(report, source)
    _print_written(write_plots(runs, batched, out_dir), console)


def _cmd_plot_saved(args: argparse.Namespace) -> int:
    """--from-report: figures from saved reports; nothing is run, so no run option may be given."""
    from rich.console import Console

    from specdec.bench.plots import load_reports, write_plots

    if not args.plot:
        raise ValueError("--from-report draws figures from saved reports: give --plot DIR too")
    if args.prompts or args.output or args.batch_size:
        raise ValueError("--from-report runs nothing: drop --prompts, --output and --batch-size")
    runs, batched = load_reports(args.from_report)
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    _print_written(write_plots(runs, batched, args.plot), console)
    return 0


def _print_written(written: dict[str, str | None], console: object) -> None:
    for name, path in written.items():
        if path is None:
            console.print(f"{name}: not written (the report has nothing to draw for it, e.g. no K sweep)")
        else:
            console.print(f"figure written to {path}")
