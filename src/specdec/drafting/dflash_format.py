"""DFlash drafter <-> directory in the vLLM `speculators` dflash layout (config.json + model.safetensors).

The aux layer ids have two conventions. speculators and vLLM name the residual stream entering layer id
(the output of layer id - 1; vLLM derives `dflash_config.target_layer_ids = id - 1`). We store the
outputs of those layers (DFlash's own `target_layer_ids`, transformers' `hidden_states[id + 1]`) and mark
it with `specdec.aux_layers_are_outputs`; a config without that key is a speculators/vLLM checkpoint and
its ids are read minus one. `dflash_vllm.py` writes ours in their convention.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdec.drafting.dflash_model import DFlashConfig, DFlashDrafter
from specdec.drafting.drafter_format import (
    SPECULATORS_VERSION,
    check_verifier,
    load_drafter,
    save_drafter,
    verifier_block,
)

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel

AUX_MARKER = "aux_layers_are_outputs"  # in the `specdec` block: the aux ids are layer outputs (ours)


def dflash_config_json(c: DFlashConfig, target: LoadedModel, extra: dict | None = None) -> dict[str, Any]:
    layer = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.num_hidden_layers,
        "layer_types": ["full_attention"] * c.num_hidden_layers,
        "use_sliding_window": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
    }
    embed_scale = target.decoder.arch.embed_scale if target.decoder is not None else None
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": c.draft_vocab_size,
        "block_size": c.block_size,
        "mask_token_id": c.mask_token_id,
        "target_hidden_size": c.target_hidden_size,
        "aux_hidden_state_layer_ids": list(c.aux_layer_ids),
        "sliding_window_non_causal": False,
        "projector_type": "dflash",
        "sample_from_anchor": False,  # slot 0 holds the anchor; slots 1..B-1 are the B-1 draft tokens
        "shift_label": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": c.block_size - 1,
                 "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": verifier_block(target),
        },
        # not part of speculators: the target's embedding (scaled as the target scales it) and LM head are
        # shared, not stored here
        "specdec": {"shares_target_embedding": True, "shares_target_lm_head": True,
                    "input_embedding_scale": embed_scale or 1.0,
                    AUX_MARKER: "hidden_states[id + 1]", **(extra or {})},
    }


def aux_layer_outputs(config: dict[str, Any]) -> list[int]:
    """The target layers whose outputs a saved DFlash config reads (our convention), from ours or from a
    speculators/vLLM checkpoint (see the module note)."""
    ids = [int(i) for i in config["aux_hidden_state_layer_ids"]]
    return ids if AUX_MARKER in config.get("specdec", {}) else [i - 1 for i in ids]


def save_dflash(directory: Path, drafter: DFlashDrafter, target: LoadedModel, extra: dict | None = None) -> None:
    save_drafter(directory, dflash_config_json(drafter.config, target, extra), dict(drafter.state_dict()))


def load_dflash(directory: str | Path, target: LoadedModel) -> tuple[DFlashDrafter, dict[str, Any]]:
    config, tensors = load_drafter(directory, "dflash")
    check_verifier(Path(directory), config["speculators_config"]["verifier"], target)
    if config.get("sample_from_anchor") or config.get("projector_type", "dflash") != "dflash":
        raise ValueError(f"{directory}: only plain DFlash drafters (sample_from_anchor false) are supported")
    layer = config["transformer_layer_config"]
    if config.get("mask_token_id") is None:
        raise ValueError(f"{directory}: the DFlash config has no mask_token_id")
    if AUX_MARKER not in config.get("specdec", {}) and _causal_or_sliding(config, layer):
        raise ValueError(f"{directory}: its draft layers attend causally or over a sliding window (as vLLM reads "
                         "the config); specdec's DFlash block attends to itself bidirectionally, over full attention")
    c = DFlashConfig(
        hidden_size=layer["hidden_size"],
        intermediate_size=layer["intermediate_size"],
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer.get("num_key_value_heads") or layer["num_attention_heads"],
        head_dim=layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"],
        num_hidden_layers=layer["num_hidden_layers"],
        vocab_size=layer["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
        block_size=config["block_size"],
        mask_token_id=config["mask_token_id"],
        aux_layer_ids=aux_layer_outputs(config),
        rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=layer.get("rope_theta") or (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        max_position_embeddings=layer.get("max_position_embeddings", 32768),
    )
    drafter = DFlashDrafter(c)
    tensors = {k: v for k, v in tensors.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    if "t2d" not in tensors:  # speculators/vLLM: no t2d, and no d2t either for a full draft vocabulary
        if "d2t" not in tensors and c.draft_vocab_size != c.vocab_size:
            raise ValueError(f"{directory}: a draft vocabulary of {c.draft_vocab_size} tokens without its d2t map")
        d2t = tensors.setdefault("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        ids = torch.arange(d2t.numel()) + d2t
        tensors["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, ids, True)
    drafter.load_state_dict(tensors)
    return drafter, config


def _causal_or_sliding(config: dict[str, Any], layer: dict[str, Any]) -> bool:
    """Whether vLLM runs this DFlash config's draft layers causally or windowed (`qwen3_dflash.py`: the layer
    config's `is_causal`, else `not sliding_window_non_causal`, default non-causal)."""
    causal = layer.get("is_causal")
    if causal is None:
        causal = not config.get("sliding_window_non_causal", True)
    return bool(causal) or "sliding_attention" in (layer.get("layer_types") or [])
