"""vLLM (CPU build) and specdec on the same prompts: plain, n-gram and our exported Medusa drafter (both layouts).

    scripts/vllm_interop.sh            # creates /work/vllm-venv when missing, then runs this
    VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-venv/bin/python benchmarks/peers/vllm_interop.py --limit 12 --max-tokens 96

Run with the vLLM environment's python. It
1. asks the project's python (`--project-python`) for the default model's HF folder and exports the shipped
   Medusa drafter with `specdec drafter export-vllm`, twice: with the target's whole LM head (the default)
   and with `--token-map` (the drafter's own reduced vocabulary);
2. runs each vLLM mode in its own process (`vllm_modes.py`): plain, `ngram`, `medusa` (the whole-head
   export) and `medusa-token-map` (which vLLM 0.32 loads only with `enable_weights_track` off), one request
   at a time, greedy, with vLLM's spec-decode counters per prompt;
3. runs specdec's side in the project's python (`specdec_side.py`): plain, the same n-gram settings, both
   exports drafted as vLLM drafts them (each head's top-1, a chain of 4, no context tokens), and the shipped
   Medusa drafter with its own defaults; with the target's top-2 logit margin where a vLLM output leaves our
   plain output;
4. prints both engines' tok/s, identity and acceptance side by side, then the accepted tokens per draft
   position of each pair of modes summed over the prompts whose outputs are the same in both engines (where
   the texts differ, so do the drafts), and writes everything to --output.
If vLLM cannot run a mode, its exact error (the engine's root cause) is printed instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from itertools import zip_longest
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from vllm_cpu_batched import read_prompts, tokenize  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
MEDUSA_HEADS = 4
CHAIN = [[0] * depth for depth in range(1, MEDUSA_HEADS + 1)]  # each head's top-1: what vLLM's Medusa drafts
# vLLM 0.32 registers a checkpoint's token_map as a parameter without reporting it loaded (vllm_export.py)
TOKEN_MAP_KWARGS = {"model_loader_extra_config": {"enable_weights_track": False}}
# (vLLM mode, specdec mode) drafting alike
PAIRS = (("ngram", "ngram"), ("medusa", "medusa-export-chain"), ("medusa-token-map", "medusa-token-map-chain"))


def project(python: str, *args: str) -> str:
    done = subprocess.run([python, *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


GENERIC = ("Engine core initialization failed", "WorkerProc initialization failed")


def root_cause(log: str) -> str:
    """The first specific exception line vLLM logged: its worker and engine processes log the real cause
    before the front end's generic "Engine core initialization failed"."""
    lines = [ln.split("] ", 1)[-1].strip() for ln in log.splitlines()
             if "Error: " in ln or "Error(" in ln or "Exception: " in ln]
    specific = [ln for ln in lines if not any(g in ln for g in GENERIC)]
    return (specific or lines or ["(no error line in the log)"])[0]


def run_vllm(job_path: Path, mode: str, work: Path) -> dict[str, Any]:
    out, log = work / f"vllm-{mode}.json", work / f"vllm-{mode}.log"
    with log.open("w") as f:
        code = subprocess.run([sys.executable, str(HERE / "vllm_modes.py"), "--job", str(job_path), "--mode", mode,
                               "--output", str(out)], stdout=f, stderr=subprocess.STDOUT).returncode
    result = json.loads(out.read_text()) if out.exists() else {"error": f"exited {code}"}
    if "error" in result:
        result["root_cause"] = root_cause(log.read_text())
        result["log"] = str(log)
    return result


def acceptance(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
    if not draft_tokens:
        return "no drafts"
    rate = accepted / draft_tokens
    return (f"rate {rate:.3f} ({accepted}/{draft_tokens}), {accepted / drafts:.2f} accepted per draft, "
            f"per position {per_pos}")


def same(a: list[list[int]], b: list[list[int]]) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def same_output_acceptance(theirs: str, v: dict[str, Any], mine: str, o: dict[str, Any]) -> str:
    """Accepted tokens per draft position in both engines, over the prompts they decode to the same text."""
    both = [i for i, (a, b) in enumerate(zip(v["token_ids"], o["token_ids"])) if a == b]
    # per-position lists differ in length between prompts (a prompt that never reached position 5)
    vp = [sum(x) for x in zip_longest(*(v["per_prompt"][i].get("num_accepted_tokens_per_pos", []) for i in both),
                                      fillvalue=0)]
    op = [sum(x) for x in zip_longest(*(o["per_prompt"][i]["accepted_per_position"] for i in both), fillvalue=0)]
    drafts = (sum(v["per_prompt"][i].get("num_drafts", 0) for i in both),
              sum(o["per_prompt"][i]["num_drafts"] for i in both))
    return (f"same text in both ({len(both)}/{len(v['token_ids'])} prompts): accepted per position vLLM {theirs} "
            f"{vp} in {drafts[0]} drafts, specdec {mine} {op} in {drafts[1]} drafts")


def report(vllm: dict[str, Any], ours: dict[str, Any], n: int) -> list[str]:
    lines = [f"{'engine / mode':<34} {'tok/s':>7}  {'= own plain':>11}  {'= specdec plain':>15}  acceptance"]
    our_plain = ours["modes"]["plain"]["token_ids"]
    vllm_plain = vllm.get("plain", {}).get("token_ids")
    for mode, r in vllm.items():
        if "error" in r:
            lines.append(f"{'vLLM ' + mode:<34} ERROR {r['error']}")
            lines.append(f"{'':<34} root cause: {r['root_cause']}")
            continue
        s = r["spec_decode"]
        acc = acceptance(s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"],
                         s.get("num_accepted_tokens_per_pos", [])) if r["config"] else "-"
        own = same(r["token_ids"], vllm_plain) if vllm_plain else "?"
        lines.append(f"{'vLLM ' + mode:<34} {r['tok_per_s']:7.1f}  {own:>11}  {same(r['token_ids'], our_plain):>15}  {acc}")
    for mode, r in ours["modes"].items():
        s = r["stats"]
        per_pos = s["accepted_per_position"]
        acc = acceptance(s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"], per_pos) \
            if r["config"] else "-"
        own = same(r["token_ids"], our_plain)
        lines.append(f"{'specdec ' + mode:<34} {r['tok_per_s']:7.1f}  {own:>11}  {own:>15}  {acc}")
    for theirs, mine in PAIRS:
        if theirs in vllm and "error" not in vllm[theirs] and mine in ours["modes"]:
            lines.append(same_output_acceptance(theirs, vllm[theirs], mine, ours["modes"][mine]))
    for label, found in ours["divergences"].items():
        for d in found:
            lines.append(f"vLLM {label} leaves specdec plain on prompt {d['prompt']} at token {d['position']}: "
                         f"ours {d['baseline_token']}, vLLM's {d['vllm_token']}; target's top-2 logit margin there "
                         f"{d['top2_logit_margin']:.4f} (logit gap ours - vLLM's {d['logit_gap']})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=ROOT / "benchmarks/prompts/other_kinds.jsonl")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--project-python", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--medusa", default="gemma-3-270m-medusa", help="our Medusa drafter (shipped name or folder)")
    ap.add_argument("--modes", default="plain,ngram,medusa,medusa-token-map", help="vLLM modes to run")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "specdec-vllm-interop")
    ap.add_argument("--output", type=Path, default=None, help="JSON report (default: WORK/report.json)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    py = args.project_python

    model = project(py, "-c", "from specdec.models.loading import local_model_folder; "
                              "print(local_model_folder('gemma-3-270m'))").strip()
    export = args.work / "medusa-vllm"
    print(f"target folder {model}\nexporting {args.medusa} -> {export}", flush=True)
    project(py, "-m", "specdec.cli", "drafter", "export-vllm", args.medusa, "--output", str(export))
    export_map = args.work / "medusa-vllm-token-map"
    project(py, "-m", "specdec.cli", "drafter", "export-vllm", args.medusa, "--token-map", "--output",
            str(export_map))

    prompts = read_prompts(args.prompts, args.limit)
    prompt_ids, _ = tokenize(model, prompts)
    modes = {"plain": None, "ngram": NGRAM,
             "medusa": {"method": "medusa", "model": str(export), "num_speculative_tokens": MEDUSA_HEADS},
             "medusa-token-map": {"method": "medusa", "model": str(export_map),
                                  "num_speculative_tokens": MEDUSA_HEADS}}
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    job = {"model": model, "prompt_token_ids": prompt_ids, "max_tokens": args.max_tokens,
           "max_model_len": max(map(len, prompt_ids)) + args.max_tokens + 16,
           "vllm_modes": {m: modes[m] for m in chosen}, "llm_kwargs": {"medusa-token-map": TOKEN_MAP_KWARGS}}
    job_path = args.work / "job.json"
    job_path.write_text(json.dumps(job))

    vllm: dict[str, Any] = {}
    for mode in chosen:
        print(f"== vLLM {mode}", flush=True)
        vllm[mode] = run_vllm(job_path, mode, args.work)
        r = vllm[mode]
        print(f"   {r['tok_per_s']:.1f} tok/s" if "error" not in r else f"   ERROR {r['root_cause']}", flush=True)

    ours_job = {"model": "gemma-3-270m", "prompt_token_ids": prompt_ids, "max_tokens": args.max_tokens,
                "modes": {"plain": None, "ngram": NGRAM,
                          "medusa-export-chain": {"method": "medusa", "model": str(export), "medusa_choices": CHAIN,
                                                  "num_speculative_tokens": MEDUSA_HEADS, "context_vocab": False},
                          "medusa-token-map-chain": {"method": "medusa", "model": str(export_map),
                                                     "medusa_choices": CHAIN, "num_speculative_tokens": MEDUSA_HEADS,
                                                     "context_vocab": False},
                          "medusa-shipped-defaults": {"method": "medusa", "model": args.medusa}},
                "others": {m: r["token_ids"] for m, r in vllm.items() if "token_ids" in r}}
    ours_path, ours_out = args.work / "specdec-job.json", args.work / "specdec.json"
    ours_path.write_text(json.dumps(ours_job))
    print("== specdec", flush=True)
    subprocess.run([py, str(HERE / "specdec_side.py"), "--job", str(ours_path), "--output", str(ours_out)],
                   check=True, cwd=ROOT)
    ours = json.loads(ours_out.read_text())

    import vllm as vllm_module

    lines = [f"{len(prompt_ids)} prompts of {args.prompts.name}, {args.max_tokens} new tokens, greedy, bf16, "
             f"one request at a time; vLLM {vllm_module.__version__} (CPU)", *report(vllm, ours, len(prompt_ids))]
    print("\n".join(lines))
    output = args.output or args.work / "report.json"
    output.write_text(json.dumps({"table": lines, "vllm": vllm, "specdec": ours, "prompts": str(args.prompts),
                                  "limit": args.limit, "max_tokens": args.max_tokens}, indent=1))
    print(f"report: {output}")
    return 0 if all("error" not in r for r in vllm.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
