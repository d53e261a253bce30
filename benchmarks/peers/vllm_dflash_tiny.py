"""Our DFlash export served by vLLM on a target it supports: a tiny random Qwen3, against specdec.

    VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-venv/bin/python benchmarks/peers/vllm_dflash_tiny.py

Run with the vLLM environment's python. The project's python (`dflash_tiny_qwen3.py`) builds the target,
trains and exports the drafter and decodes with specdec; then vLLM decodes the same prompts plain and with
the export (`vllm_modes.py`, K = the block size - 1, as the export states), and both acceptance figures are
printed. Drafts are counted alike in both: a draft is a step with at least one proposed token, acceptance =
accepted / drafted tokens.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_eagle3_tiny import compare  # noqa: E402


def main() -> int:
    return compare("dflash", "dflash_tiny_qwen3.py", lambda ours, config: (
        f"tiny Qwen3 target, DFlash drafter (block {config['block_size']}, draft vocabulary "
        f"{config['draft_vocab_size']}), K={ours['k']}, {len(ours['prompt_token_ids'])} prompts, "
        f"{ours['max_tokens']} new tokens, greedy, bf16"))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.exit(main())
