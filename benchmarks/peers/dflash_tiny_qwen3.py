"""specdec's half of benchmarks/peers/vllm_dflash_tiny.py, run with the *project's* python.

    .venv/bin/python benchmarks/peers/dflash_tiny_qwen3.py --work DIR --prompts 8 --max-tokens 48

Builds a tiny random Qwen3 (vLLM's DFlash needs a target with the EAGLE-3 interface; the byte-level
tokenizer of eagle3_tiny_llama.py), saves it to DIR/target, trains a DFlash drafter of block B = K + 1 for
it briefly with our trainer on responses the target wrote greedily, exports it with `export_for_vllm` to
DIR/dflash-vllm, decodes the same random prompts with specdec (plain and the exported drafter, a chain of
K = B - 1, context_vocab off: what vLLM drafts) and writes DIR/specdec.json.

The target's attention output projections are zeroed, so its next token depends on the current token
only: a drafter learns it in a few dozen steps, yet not perfectly, so acceptance is neither 0 nor 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_tiny_llama import DRAFT_VOCAB, K, train_export_decode
from specdec.training.self_distill import Sample
from specdec.training.train_dflash import DFlashTrainOptions, train_dflash
from specdec.training.trainer import TrainSettings


def main() -> None:
    def train(target: Any, samples: list[Sample], drafter: Path, settings: TrainSettings) -> dict:
        # block K + 1: the whole block after its anchor is the draft (vLLM's block is 1 + K)
        return train_dflash(target, samples, drafter, settings,
                            DFlashTrainOptions(block_size=K + 1, num_layers=2, draft_vocab_size=DRAFT_VOCAB,
                                               num_anchors=32, context_vocab=False),
                            progress=False, overwrite=True)

    train_export_decode("dflash", "qwen3", train, {"context_vocab": False, "confidence_threshold": 0.0})


if __name__ == "__main__":
    main()
