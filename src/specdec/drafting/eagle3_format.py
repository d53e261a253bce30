"""EAGLE-3 drafter <-> directory in the vLLM `speculators` eagle3 layout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.drafting.drafter_format import SPECULATORS_VERSION, check_verifier, load_drafter, save_drafter, verifier_block
from specdec.drafting.eagle3_model import Eagle3Config, Eagle3Drafter

if TYPE_CHECKING:
    from specdec.models.loading import LoadedModel


def eagle3_config_json(c: Eagle3Config, target: LoadedModel, num_speculative_tokens: int, extra: dict | None = None) -> dict[str, Any]:
    layer = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layer_ids),
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                 "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": verifier_block(target),
        },
        # not part of speculators: the target's embedding and LM head are shared, not stored here
        "specdec": {"shares_target_embedding": True, "shares_target_lm_head": True, **(extra or {})},
    }


def save_eagle3(directory: Path, drafter: Eagle3Drafter, target: LoadedModel, num_speculative_tokens: int = 5,
                extra: dict | None = None) -> None:
    save_drafter(directory, eagle3_config_json(drafter.config, target, num_speculative_tokens, extra),
                 dict(drafter.state_dict()))


def load_eagle3(directory: str | Path, target: LoadedModel) -> tuple[Eagle3Drafter, dict[str, Any]]:
    config, tensors = load_drafter(directory, "eagle3")
    check_verifier(Path(directory), config["speculators_config"]["verifier"], target)
    layer = config["transformer_layer_config"]
    c = Eagle3Config(
        hidden_size=layer["hidden_size"],
        intermediate_size=layer["intermediate_size"],
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"],
        head_dim=layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"],
        vocab_size=layer["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        target_hidden_size=config["target_hidden_size"],
        aux_layer_ids=list(config["eagle_aux_hidden_state_layer_ids"]),
        rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=layer["rope_theta"],
        max_position_embeddings=layer["max_position_embeddings"],
        norm_before_residual=bool(config.get("norm_before_residual", False)),
    )
    drafter = Eagle3Drafter(c)
    tensors = {k: v for k, v in tensors.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    drafter.load_state_dict(tensors)
    return drafter, config
