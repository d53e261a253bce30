"""Loads exported drafters with the `speculators` package's own config and model classes (vLLM's python,
where speculators is installed; it is not a project dependency).

    /work/vllm-venv/bin/python benchmarks/peers/validate_exports.py DIR [DIR ...]

For a speculators-layout drafter (EAGLE-3, DFlash, MTP, ...): `SpeculatorModelConfig.from_pretrained`
must resolve its registered config class, `SpeculatorModel.from_pretrained` its model class, and every
tensor of the directory must arrive in the model unchanged (nothing missing, nothing left over). A vLLM
Medusa checkpoint is read with vLLM's own `MedusaConfig` instead: speculators 0.9.0 has no Medusa class.
Exits 1 when any directory fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def check_speculators(folder: Path) -> str:
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(folder))
    model = SpeculatorModel.from_pretrained(str(folder), config=config)
    state = model.state_dict()
    saved = load_file(str(folder / "model.safetensors"))
    missing = sorted(k for k in saved if k not in state)
    changed = sorted(k for k in saved if k in state and not torch.equal(state[k].to(saved[k].dtype), saved[k]))
    if missing or changed:
        raise ValueError(f"not in the model: {missing}; loaded with other values: {changed}")
    return (f"{type(config).__name__} + {type(model).__name__}: {len(saved)} tensors loaded unchanged "
            f"(draft vocab {getattr(config, 'draft_vocab_size', '?')})")


def check_vllm_medusa(folder: Path) -> str:
    from vllm.transformers_utils.configs.medusa import MedusaConfig

    config = MedusaConfig.from_pretrained(str(folder))
    saved = load_file(str(folder / "model.safetensors"))
    heads = [k for k in saved if k.startswith("lm_head")]
    if config.truncated_vocab_size < config.vocab_size and "token_map" not in saved:
        raise ValueError("truncated_vocab_size < vocab_size without a token_map")
    return (f"speculators 0.9.0 has no Medusa class; vLLM's MedusaConfig reads {config.num_heads} heads x "
            f"{config.num_hidden_layers} layer(s), vocabulary {config.truncated_vocab_size}/{config.vocab_size}, "
            f"LM head tensors {heads}")


def main() -> int:
    failed = 0
    for arg in sys.argv[1:]:
        folder = Path(arg)
        config = json.loads((folder / "config.json").read_text())
        try:
            line = check_speculators(folder) if "speculators_model_type" in config else check_vllm_medusa(folder)
            print(f"OK   {folder}: {line}")
        except Exception as exc:  # noqa: BLE001 - report every directory
            failed += 1
            print(f"FAIL {folder}: {type(exc).__name__}: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
