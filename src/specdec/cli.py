"""`specdec generate | bench | bench serve | bench soak | serve | demo | quality | check | train ...`: the command line. Subcommands
import their heavy modules lazily."""

from __future__ import annotations

import argparse
import json
import sys

from specdec.cli_errors import run_reporting_errors
from specdec.defaults import DEFAULT_MODEL, DTYPE_NAMES


def add_model_args(parser: argparse.ArgumentParser, speculative: bool = True) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"alias, GGUF file, HF folder or hub id (default {DEFAULT_MODEL})")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPE_NAMES))
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument(
        "--quantization", default=None,
        help="quantization of the linear layers and LM head: int8 (per channel), int4 (4-bit groups of 32, "
        "per-row int8 activations with SmoothQuant), w8a8_int8 "
        "(int8 weights and per-row int8 activations with SmoothQuant: verification rows nearly free on AMX) or "
        "gguf (a GGUF model's own quantized tensors, e.g. the default model's Q4_K_M); default: none",
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="CPU threads for torch (default: torch's choice, one per core). On a CPU shared with other "
        "busy processes, fewer threads avoid OpenMP spin-wait slowdowns.",
    )
    if not speculative:
        return
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='JSON, vLLM keys, e.g. \'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}\'',
    )


def parse_speculative_config(text: str | None, quantization: str | None = None, device: str | None = None):
    """--speculative-config for a target of `quantization` on `device` (None: cuda where available); a
    drafter's stored default may depend on them."""
    from specdec.speculative_config import SpeculativeConfig

    return None if text is None else SpeculativeConfig.from_json(text, "--speculative-config", quantization, device)


def cmd_generate(args: argparse.Namespace) -> int:
    from specdec.api import LLM
    from specdec.sampling_params import SamplingParams

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt:
        raise ValueError("no prompt: pass it as an argument or on stdin")
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens,
        seed=args.seed, stop=args.stop or [],
    )
    config = parse_speculative_config(args.speculative_config, args.quantization, args.device)
    llm = LLM(model=args.model, speculative_config=config, dtype=args.dtype, device=args.device,
              quantization=args.quantization)
    printed = ""
    last = None
    for last in llm.stream(prompt, params):
        text = last.checker.text()
        if len(text) > len(printed) and text.startswith(printed):
            sys.stdout.write(text[len(printed) :])
            sys.stdout.flush()
            printed = text
    sys.stdout.write("\n")
    if last is not None:
        stats = last.stats
        finish = last.finish
        print(f"[finish_reason={finish.reason if finish else None}] {stats.summary_line()}", file=sys.stderr)
        if args.stats_json:
            print(json.dumps(stats.to_dict()), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt (argument or stdin), streamed")
    gen.add_argument("prompt", nargs="?", default=None)
    add_model_args(gen)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--stats-json", action="store_true", help="also print the statistics as JSON on stderr")
    gen.set_defaults(func=cmd_generate)

    from specdec.bench.command import add_bench_parser
    from specdec.bench.serve_load import add_bench_serve_parser
    from specdec.bench.soak import add_bench_soak_parser
    from specdec.check.command import add_check_parser
    from specdec.demo import add_demo_parser
    from specdec.quality.command import add_quality_parser
    from specdec.serving.server import add_serve_parser
    from specdec.training.commands import add_training_parsers

    add_bench_parser(sub)
    add_bench_serve_parser(sub)
    add_bench_soak_parser(sub)
    add_serve_parser(sub)
    add_demo_parser(sub)
    add_quality_parser(sub)
    add_check_parser(sub)
    add_training_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; errors come back as one line on stderr and an exit status (see cli_errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] in (["bench", "serve"], ["bench", "soak"]):  # spelled `bench-serve` / `bench-soak` inside
        argv = [f"bench-{argv[1]}", *argv[2:]]
    return run_reporting_errors(lambda: run(argv))


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    threads = getattr(args, "threads", None)
    if threads is not None:  # not a truthiness test: --threads 0 is an error, not "torch's choice"
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
