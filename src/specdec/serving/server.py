"""`specdec serve`: loads the model once, warms it up, and serves the OpenAI API with uvicorn.

    specdec serve --model M --speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' \\
        --host 127.0.0.1 --port 8000 [--threads 1] [--max-num-seqs 32] [--max-waiting 64] [--api-key K] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time

API_KEY_ENV = "SPECDEC_API_KEY"
KV_SHARE_OF_FREE_MEMORY = 0.5  # the default KV budget: at most this share of the memory free after loading

DESCRIPTION = """\
An OpenAI-compatible server (FastAPI + uvicorn) over the speculative engine: /v1/completions,
/v1/chat/completions, /v1/models, /health, /version and Prometheus /metrics. Generations run on one worker
thread: up to --max-num-seqs at a time share every batched forward (continuous batching, FIFO admission,
long prompts read in chunks of --max-num-batched-tokens between decode steps); up to --max-waiting more wait
in the queue, and beyond that requests get 429. A request whose KV cache could never fit in
--kv-cache-memory-gib gets 400 naming the limit; by default that budget, and the longest prompt accepted, come
from the memory free once the model is loaded. While streams decode, prefill chunks are paced so that each
step takes at most (1 + --prefill-pacing) times a decode-only step.

With --api-key (or $SPECDEC_API_KEY) every /v1 route needs `Authorization: Bearer <key>`. POST bodies must be
`Content-Type: application/json` (else 415), and --allowed-hosts limits the Host header (DNS rebinding)."""


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from specdec.cli import add_model_args

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding and /metrics",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: --model)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + max_tokens (default: the model's max_position_embeddings)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt accepted (default: max-model-len - 1, or less when a longer prompt's KV cache "
                   "would not fit in --kv-cache-memory-gib)")
    p.add_argument("--max-tokens-limit", type=int, default=2048,
                   help="largest max_tokens a request may ask for; also the chat default (default 2048)")
    p.add_argument("--max-num-seqs", type=int, default=32,
                   help="requests generating at once, in one batched forward; each holds a KV cache (default 32)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="rows per engine step: verification rows first, then prefill chunks; it bounds how long "
                   "running streams wait while a long prompt is read (default 512; offline LLM.generate takes 2048)")
    p.add_argument("--kv-cache-memory-gib", type=float, default=None,
                   help="KV caches of the running requests together; admission waits beyond it (default: 4, or "
                   f"{KV_SHARE_OF_FREE_MEMORY:.0%}% of the memory free after loading the model if that is less)")
    p.add_argument("--prefill-pacing", type=float, default=0.5,
                   help="while requests decode, prefill chunks may slow a step by this share at most (default 0.5: "
                   "a long prompt keeps running streams' inter-token gap under 1.5x)")
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond those (default 64); then 429")
    p.add_argument("--metrics-window", type=float, default=60.0,
                   help="seconds covered by the acceptance-rate and efficiency gauges (default 60)")
    p.add_argument("--no-warmup", action="store_true", help="skip the short generation run before serving")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require `Authorization: Bearer <key>` on every /v1 route (default: ${API_KEY_ENV})")
    p.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                   help="Host header values accepted (e.g. localhost 127.0.0.1 '*.example.com'); others get 400")
    p.add_argument("--max-connections", type=int, default=256,
                   help="open connections at most; beyond, uvicorn answers 503 (default 256)")
    p.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="seconds an idle keep-alive connection stays open (default 5)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds to receive a request body, else 408 (default 30)")
    p.add_argument("--stream-stall-timeout", type=float, default=60.0,
                   help="a client that reads nothing of its response for this many seconds is cancelled (default 60)")
    p.add_argument("--tokenizer-workers", type=int, default=2,
                   help="threads that tokenize and template requests, at most this many at once (default 2)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_serve)


def _check_args(args: argparse.Namespace) -> None:
    problems = []
    for name in ("max_num_seqs", "max_tokens_limit", "max_connections", "tokenizer_workers"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_waiting < 0:
        problems.append("--max-waiting must be >= 0")
    for name in ("max_model_len", "max_prompt_tokens"):
        value = getattr(args, name)
        if value is not None and value < 2:
            problems.append(f"--{name.replace('_', '-')} must be >= 2")
    for name in ("metrics_window", "prefill_pacing", "timeout_keep_alive", "body_timeout", "stream_stall_timeout"):
        if not getattr(args, name) > 0:
            problems.append(f"--{name.replace('_', '-')} must be > 0")
    if args.kv_cache_memory_gib is not None and not args.kv_cache_memory_gib > 0:
        problems.append("--kv-cache-memory-gib must be > 0")
    if args.api_key is not None and not args.api_key.strip():
        problems.append(f"--api-key (or ${API_KEY_ENV}) is empty")
    if not 0 <= args.port <= 65535:
        problems.append("--port must be in [0, 65535]")
    if problems:
        raise ValueError("; ".join(problems))


def build_state(args: argparse.Namespace):
    """Loads the model and builds everything the app needs (without starting the worker)."""
    from specdec.api import LLM
    from specdec.cli import parse_speculative_config
    from specdec.sampling_params import SamplingParams
    from specdec.serving.app import ServerState
    from specdec.serving.metrics import ServerMetrics
    from specdec.serving.scheduler import Scheduler
    from specdec.serving.schemas import Limits
    from specdec.serving.tokenizer_pool import TokenizerPool, max_prompt_chars

    _check_args(args)
    config = parse_speculative_config(args.speculative_config, args.quantization, args.device)
    from specdec.scheduling.scheduler import DEFAULT_MAX_NUM_BATCHED_TOKENS

    batched_tokens = (DEFAULT_MAX_NUM_BATCHED_TOKENS if args.max_num_batched_tokens is None  # not the offline 2048
                      else args.max_num_batched_tokens)
    llm = LLM(model=args.model, speculative_config=config, dtype=args.dtype, device=args.device,
              quantization=args.quantization, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=batched_tokens)
    if llm.max_model_len is None:
        raise ValueError("the model does not say its context length: pass --max-model-len")
    kv_budget = kv_cache_budget(args.kv_cache_memory_gib)
    llm.scheduler_config = dataclasses.replace(llm.scheduler_config, kv_cache_memory_bytes=kv_budget,
                                               prefill_pacing=args.prefill_pacing)
    max_model_len = int(llm.max_model_len)
    prompt_cap = prompt_tokens_within(kv_budget, llm.model.kv_bytes_per_token)
    max_prompt_tokens = min(args.max_prompt_tokens or max_model_len - 1, max_model_len - 1, prompt_cap)
    source = ("--kv-cache-memory-gib: a longer prompt's KV cache would not fit" if max_prompt_tokens == prompt_cap
              else "--max-prompt-tokens" if max_prompt_tokens == args.max_prompt_tokens else "--max-model-len")
    limits = Limits(
        max_model_len=max_model_len,
        max_prompt_tokens=max_prompt_tokens,
        max_tokens_limit=min(args.max_tokens_limit, max_model_len - 1),
        vocab_size=llm.model.vocab_size,
        max_prompt_chars=max_prompt_chars(llm.tokenizer, max_prompt_tokens),
        prompt_limit_source=source,
    )
    if not args.no_warmup:  # builds the row kernel if needed and touches every weight once
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))
    name = args.served_model_name or args.model
    k = config.num_speculative_tokens if config is not None else 0
    metrics = ServerMetrics(name, k, args.metrics_window)

    scheduler = Scheduler(llm, metrics, max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting,
                          threads=args.threads, stall_timeout=args.stream_stall_timeout)
    return ServerState(
        model_name=name, model_path=llm.model.name, tokenizers=TokenizerPool(llm.tokenizer, args.tokenizer_workers),
        limits=limits, scheduler=scheduler, metrics=metrics, speculative_config=config.to_dict() if config else None,
        created=int(time.time()), api_key=args.api_key, allowed_hosts=args.allowed_hosts, body_timeout=args.body_timeout,
    )


def kv_cache_budget(requested_gib: float | None) -> int:
    """Bytes for the running requests' KV caches: as requested, else 4 GiB or half the free memory if less."""
    if requested_gib is not None:
        return int(requested_gib * 2**30)
    import psutil

    return int(min(4 * 2**30, KV_SHARE_OF_FREE_MEMORY * psutil.virtual_memory().available))


def prompt_tokens_within(kv_budget: int, kv_bytes_per_token: int) -> int:
    """The longest prompt whose KV cache (with room for one forward's draft and one new token) fits."""
    from specdec.engine.sequence import MAX_TOKENS_PER_FORWARD

    return max(kv_budget // kv_bytes_per_token - MAX_TOKENS_PER_FORWARD - 1, 1)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.serving.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    state = build_state(args)
    app = create_app(state)
    spec = state.speculative_config or "none (plain decoding)"
    print(f"specdec serve: {state.model_name!r} ready in {time.perf_counter() - started:.1f} s; speculative config: "
          f"{spec}; max_model_len {state.limits.max_model_len}, max prompt {state.limits.max_prompt_tokens} tokens, "
          f"max_tokens <= {state.limits.max_tokens_limit}; {args.max_num_seqs} running + {args.max_waiting} queued; "
          f"KV caches <= {state.scheduler.batch.config.kv_cache_memory_bytes / 2**30:.2f} GiB; "
          f"API key {'required' if state.api_key else 'not required'}; "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5,
                limit_concurrency=args.max_connections, timeout_keep_alive=args.timeout_keep_alive)
    return 0
