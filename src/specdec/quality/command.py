"""`specdec quality`: perplexity and top-1 agreement of quantized targets against bf16 on held-out text."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any


def add_quality_parser(sub: argparse._SubParsersAction) -> None:
    from specdec.cli import add_model_args

    p = sub.add_parser(
        "quality", help="perplexity and top-1 agreement of quantized targets against bf16 on held-out text",
        description="Scores held-out WikiText-2 articles (the ones the benchmark prompts use and training skips) "
        "with the dense target and each --quantization (comma-separated, e.g. int8,int4,gguf): perplexity, "
        "and the fraction of positions where the quantized target's top-1 token is bf16's.")
    add_model_args(p, speculative=False)
    p.add_argument("--data-dir", default=None, help="folder holding wikitext2/articles.jsonl (default ../shared/data/train)")
    p.add_argument("--articles", type=int, default=8, help="held-out articles scored (default 8)")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens scored per article (default 1024)")
    p.add_argument("--output", default=None, help="write the JSON report here")
    p.set_defaults(func=cmd_quality)


def run_quality(model: str, quantizations: list[str], dtype: str = "bfloat16", device: str | None = None,
                data_dir: str | None = None, articles: int = 8, max_tokens: int = 1024,
                progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    from specdec.models.loading import load_model
    from specdec.quality.held_out_text import held_out_articles
    from specdec.quality.perplexity import score_text, summarize

    if max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2, got {max_tokens}")
    texts = held_out_articles(data_dir, limit=articles)
    rows, reference = [], None
    for q in [None, *quantizations]:
        loaded = load_model(model, dtype=dtype, device=device, quantization=q)
        ids = [loaded.tokenizer(t["text"])["input_ids"][:max_tokens] for t in texts]
        runtime = loaded.new_runtime()
        scores = [score_text(runtime, i) for i in tqdm(ids, desc=f"quality ({q or dtype})", disable=not progress,
                                                        leave=False)]
        rows.append({"quantization": q or "none", **summarize(scores, reference)})
        if reference is None:
            reference = scores
            rows[0]["top1_agreement"] = 1.0
        del loaded, runtime
        gc.collect()
    return {"model": model, "dtype": dtype, "articles": [t["id"] for t in texts], "max_tokens": max_tokens,
            "rows": rows}


def cmd_quality(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specdec.bench.quantized import parse_quantizations

    quantizations = [q for q in parse_quantizations(args.quantization) if q is not None]
    if not quantizations:
        raise ValueError("--quantization names the targets to compare with bf16, e.g. int8,int4,gguf")
    report = run_quality(args.model, quantizations, args.dtype, args.device, args.data_dir, args.articles,
                         args.max_tokens)
    table = Table(title=f"quality on {len(report['articles'])} held-out WikiText-2 articles "
                        f"(up to {report['max_tokens']} tokens each)")
    for col in ("target", "tokens", "perplexity", "top-1 agreement with bf16"):
        table.add_column(col, justify="left" if col == "target" else "right")
    for r in report["rows"]:
        table.add_row(r["quantization"], str(r["tokens"]), f"{r['perplexity']:.3f}", f"{r['top1_agreement']:.4f}")
    Console(file=sys.stdout).print(table)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["rows"]), flush=True)
    return 0
