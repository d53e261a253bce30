"""Peer comparison: vLLM (CPU build) on the same prompts and token ids as specdec.

Run with the *vLLM* environment's python, not the project's venv, e.g.::

    /work/vllm-venv/bin/python benchmarks/peers/vllm_cpu_batched.py \\
        --model ~/.cache/specdec/gguf/<key> \\
        --prompts benchmarks/prompts/other_kinds.jsonl --limit 20 --max-tokens 128 \\
        --modes plain,plain-batched,ngram-batched --output out.json

`--model` is the plain HF folder (config.json, bf16 model.safetensors, tokenizer) that specdec converts the
GGUF model into under ~/.cache/specdec/gguf/.

Prompts are rendered as specdec renders them for a tokenizer without a chat template (the first turn only:
``Question: {turn}\\nAnswer:``) and tokenized with the model folder's HF tokenizer; vLLM gets the token ids
(``{"prompt_token_ids": ids}``) so both engines see identical prompts. A model folder whose tokenizer has a
chat template is rendered through ``apply_chat_template`` instead, as specdec does.

Modes (each gets a fresh LLM, in its own subprocess of this script unless --inline):

* ``plain``          one request at a time (generate() per prompt), no speculation
* ``plain-batched``  all prompts in one generate() call, no speculation
* ``ngram-batched``  all prompts in one generate() call, n-gram (prompt lookup) speculation, k=5, n<=4
* ``ngram``          one request at a time, the same n-gram speculation (the batch-1 peer table's row)

Greedy (temperature 0), EOS honoured, bf16. The timed run follows one untimed warm-up generate. Prefix
caching is off by default so that the warm-up (and repeated prompt prefixes) cannot make later prefills free.

Output JSON: ``{mode: {seconds, tokens, tok_per_s, token_ids: [[...], ...], ...}, "vllm_version",
"prompts", ...}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIRST_TURN = "Question: {turn}\nAnswer:"  # mirrors specdec.bench.prompts.FIRST_TURN
MODES = ("plain", "plain-batched", "ngram-batched", "ngram")
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}


def read_prompts(path: Path, limit: int | None) -> list[dict]:
    """First turn of each line: ``prompt`` (plain schema) or ``turns[0]`` (MT-Bench schema)."""
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            data = json.loads(line)
            if "turns" in data:
                text = data["turns"][0]
            elif "prompt" in data:
                text = data["prompt"]
            else:
                raise ValueError(f"{path}:{lineno}: a line needs 'turns' or 'prompt'")
            qid = data.get("question_id", data.get("id", lineno))
            out.append({"question_id": qid, "category": data.get("category") or "uncategorized", "text": text})
    if limit is not None:
        out = out[:limit]
    if not out:
        raise ValueError(f"no prompts in {path}")
    return out


def _ids(encoded) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        (encoded,) = encoded
    return [int(t) for t in encoded]


def tokenize(model_dir: str, prompts: list[dict]) -> tuple[list[list[int]], bool]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    chat = bool(getattr(tok, "chat_template", None))
    ids = []
    for p in prompts:
        if chat:
            ids.append(_ids(tok.apply_chat_template([{"role": "user", "content": p["text"]}],
                                                    add_generation_prompt=True)))
        else:
            ids.append(_ids(tok(FIRST_TURN.format(turn=p["text"])).input_ids))
    return ids, chat


def run_mode(mode: str, args: argparse.Namespace, prompt_ids: list[list[int]]) -> dict:
    from vllm import LLM, SamplingParams

    config = json.loads((Path(args.model) / "config.json").read_text())
    kwargs: dict = dict(
        model=args.model,
        dtype=args.dtype,
        seed=0,
        enforce_eager=args.enforce_eager,
        max_model_len=args.max_model_len or (max(len(p) for p in prompt_ids) + args.max_tokens + 16),
        enable_prefix_caching=args.prefix_caching,
    )
    if not config.get("architectures"):
        # specdec's converted folder has "architectures": null; vLLM picks the model class from it.
        kwargs["hf_overrides"] = {"architectures": ["Gemma3ForCausalLM"]}
    if mode.startswith("ngram"):
        kwargs["speculative_config"] = dict(NGRAM_SPEC)
        kwargs["disable_log_stats"] = False  # for the draft/accepted counters
    llm = LLM(**kwargs)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=False)
    inputs = [{"prompt_token_ids": ids} for ids in prompt_ids]

    llm.generate([inputs[0]], SamplingParams(temperature=0.0, max_tokens=min(16, args.max_tokens)),
                 use_tqdm=False)  # untimed warm-up

    t0 = time.perf_counter()
    if mode in ("plain", "ngram"):
        outputs = [llm.generate([inp], sp, use_tqdm=False)[0] for inp in inputs]
    else:
        outputs = llm.generate(inputs, sp, use_tqdm=False)
    seconds = time.perf_counter() - t0

    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    tokens = sum(len(t) for t in token_ids)
    result = {
        "seconds": seconds,
        "tokens": tokens,
        "tok_per_s": tokens / seconds if seconds > 0 else None,
        "token_ids": token_ids,
        "finish_reasons": [o.outputs[0].finish_reason for o in outputs],
        "engine_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
    }
    if mode.startswith("ngram"):
        result["spec_decode_metrics"] = _spec_metrics(llm)
    del llm, outputs
    gc.collect()
    return result


def _spec_metrics(llm) -> dict | None:
    """Draft/accepted token counters, if this vLLM version exposes them (includes the warm-up)."""
    try:
        found = {}
        for m in llm.get_metrics():
            if "spec_decode" in m.name:
                if hasattr(m, "value"):
                    found[m.name] = m.value
                elif hasattr(m, "values"):
                    found[m.name] = list(m.values)
        return found or None
    except Exception as exc:  # noqa: BLE001 - metrics are optional
        return {"error": repr(exc)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder (specdec's converted cache folder)")
    ap.add_argument("--prompts", required=True, type=Path, help="jsonl with 'prompt' or 'turns' lines")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--output", type=Path, default=Path("out.json"))
    ap.add_argument("--max-model-len", type=int, default=0, help="0: longest prompt + max tokens + 16")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=0,
                    help="worker OpenMP threads, bound to cores 0..N-1 (0: vLLM's auto binding, which on a "
                    "2-core machine reserves one core for the engine process and computes on one thread)")
    ap.add_argument("--enforce-eager", action="store_true", help="skip vLLM's torch.compile (minutes on CPU)")
    ap.add_argument("--prefix-caching", action="store_true", help="enable vLLM prefix caching (off by default)")
    ap.add_argument("--inline", action="store_true",
                    help="build every mode's LLM in this process (default: one subprocess per mode)")
    ap.add_argument("--_one-mode", dest="one_mode", help=argparse.SUPPRESS)
    ap.add_argument("--_result", dest="result_file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = str(Path(args.model).expanduser())
    if args.threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; choose from {list(MODES)}")

    prompts = read_prompts(args.prompts, args.limit)
    prompt_ids, chat = tokenize(args.model, prompts)

    if args.one_mode:  # child: one mode, result to a file
        res = run_mode(args.one_mode, args, prompt_ids)
        Path(args.result_file).write_text(json.dumps(res))
        return 0

    import vllm

    report: dict = {
        "vllm_version": vllm.__version__,
        "model": args.model,
        "prompts": str(args.prompts),
        "limit": args.limit,
        "max_tokens": args.max_tokens,
        "dtype": args.dtype,
        "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "enforce_eager": args.enforce_eager,
        "chat_template": chat,
        "prompt_token_ids": prompt_ids,
        "question_ids": [p["question_id"] for p in prompts],
    }
    for mode in modes:
        print(f"== {mode}", file=sys.stderr, flush=True)
        if args.inline:
            res = run_mode(mode, args, prompt_ids)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "result.json"
                cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--_one-mode", mode,
                       "--_result", str(out)]
                rc = subprocess.run(cmd).returncode
                if rc != 0 or not out.exists():
                    res = {"error": f"mode {mode} subprocess exited {rc}"}
                else:
                    res = json.loads(out.read_text())
        report[mode] = res
        if "error" not in res:
            print(f"{mode}: {res['tokens']} tokens in {res['seconds']:.2f}s = {res['tok_per_s']:.1f} tok/s",
                  file=sys.stderr, flush=True)

    ref = report.get("plain")
    if ref and "token_ids" in ref:
        for mode in modes:
            r = report[mode]
            if mode != "plain" and "token_ids" in r:
                r["identical_to_plain"] = sum(a == b for a, b in zip(ref["token_ids"], r["token_ids"]))

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"{'mode':<15} {'seconds':>8} {'tokens':>7} {'tok/s':>8}")
    for mode in modes:
        r = report[mode]
        if "error" in r:
            print(f"{mode:<15} ERROR {r['error']}")
        else:
            same = f"  identical to plain: {r['identical_to_plain']}/{len(r['token_ids'])}" \
                if "identical_to_plain" in r else ""
            print(f"{mode:<15} {r['seconds']:8.2f} {r['tokens']:7d} {r['tok_per_s']:8.1f}{same}")
    return 0 if all("error" not in report[m] for m in modes) else 1


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
