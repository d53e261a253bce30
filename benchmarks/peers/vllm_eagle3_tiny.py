"""Our EAGLE-3 export served by vLLM on a target it supports: a tiny random Llama, against specdec.

    VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-venv/bin/python benchmarks/peers/vllm_eagle3_tiny.py

Run with the vLLM environment's python. The project's python (`eagle3_tiny_llama.py`) builds the target,
trains and exports the drafter and decodes with specdec; then vLLM decodes the same prompts plain and with
the export (`vllm_modes.py`, the same K), and both acceptance figures are printed. Drafts are counted alike
in both: a draft is a step with at least one proposed token, acceptance = accepted / drafted tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from vllm_interop import run_vllm  # noqa: E402


def figures(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
    return (f"acceptance rate {accepted / draft_tokens:.4f} ({accepted}/{draft_tokens} drafted tokens, {drafts} drafts), "
            f"accepted per position {per_pos}")


def compare(method: str, project_script: str, describe: Callable[[dict, dict], str]) -> int:
    """Runs `project_script` (the specdec side, project python), then vLLM plain and with the export of
    `method` on the same prompts, and prints both; `describe(ours, export_config)` is the heading."""
    ap = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / f"specdec-vllm-{method}-tiny")
    ap.add_argument("--project-python", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reuse", action="store_true", help="keep WORK/specdec.json from an earlier run")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ours_path = args.work / "specdec.json"
    if not (args.reuse and ours_path.exists()):
        subprocess.run([args.project_python, str(HERE / project_script), "--work", str(args.work),
                        "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens)], check=True, cwd=ROOT)
    ours = json.loads(ours_path.read_text())
    spec = {"method": method, "model": ours["export"], "num_speculative_tokens": ours["k"]}
    job = {"model": ours["target"], "prompt_token_ids": ours["prompt_token_ids"], "max_tokens": ours["max_tokens"],
           "max_model_len": 256, "vllm_modes": {"plain": None, method: spec}, "ignore_eos": True}
    job_path = args.work / "job.json"
    job_path.write_text(json.dumps(job))
    theirs = {mode: run_vllm(job_path, mode, args.work) for mode in ("plain", method)}

    n = len(ours["prompt_token_ids"])
    our_plain, our_spec = ours["modes"]["plain"]["token_ids"], ours["modes"][method]["token_ids"]
    s = ours["modes"][method]["stats"]
    print(describe(ours, json.loads((Path(ours["export"]) / "config.json").read_text())))
    print(f"specdec: identical to its plain {sum(a == b for a, b in zip(our_spec, our_plain))}/{n}; "
          + figures(s["num_drafts"], s["num_draft_tokens"], s["num_accepted_tokens"], s["accepted_per_position"]))
    for mode, r in theirs.items():
        if "error" in r:
            print(f"vLLM {mode}: ERROR {r['error']}\n   root cause: {r['root_cause']}")
    if all("error" not in r for r in theirs.values()):
        v, vp = theirs[method], theirs["plain"]
        c = v["spec_decode"]
        print(f"vLLM:    identical to its plain {sum(a == b for a, b in zip(v['token_ids'], vp['token_ids']))}/{n}, "
              f"plain identical to specdec plain {sum(a == b for a, b in zip(vp['token_ids'], our_plain))}/{n}; "
              + figures(c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"],
                        c.get("num_accepted_tokens_per_pos", [])))
    (args.work / "report.json").write_text(json.dumps({"specdec": ours, "vllm": theirs}, indent=1))
    return 0 if all("error" not in r for r in theirs.values()) else 1


def main() -> int:
    return compare("eagle3", "eagle3_tiny_llama.py", lambda ours, config: (
        f"tiny Llama target, EAGLE-3 drafter (draft vocabulary {config['draft_vocab_size']}), K={ours['k']}, "
        f"{len(ours['prompt_token_ids'])} prompts, {ours['max_tokens']} new tokens, greedy, bf16"))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
