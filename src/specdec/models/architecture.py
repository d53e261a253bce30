"""What distinguishes the decoder families we run natively, read off a Hugging Face config.

Gemma 3, Llama, Mistral, Qwen2 and Qwen3 share one pre-norm transformer skeleton; they differ only in
the handful of switches below. Anything else falls back to the transformers model (see hf_runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NATIVE_MODEL_TYPES = ("gemma3_text", "gemma3", "llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    activation: str  # "silu" or "gelu_tanh"
    gemma_norm: bool  # Gemma's RMSNorm: scale by (1 + w), computed in float32 before the cast back
    qk_norm: bool  # per-head RMSNorm on queries and keys (Qwen3, Gemma 3)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sandwich_norm: bool  # Gemma 3: norms after attention and after the MLP too
    embed_scale: float | None  # Gemma multiplies embeddings by sqrt(hidden_size)
    attn_scale: float
    layer_types: tuple[str, ...]  # "full_attention" / "sliding_attention" per layer
    sliding_window: int | None
    final_logit_softcap: float | None
    tie_word_embeddings: bool

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def is_native(config: Any) -> bool:
    return _text_config(config).model_type in NATIVE_MODEL_TYPES


def architecture_from_config(config: Any) -> Architecture:
    cfg = _text_config(config)
    model_type = cfg.model_type
    if model_type not in NATIVE_MODEL_TYPES:
        raise ValueError(f"no native decoder for model_type {model_type!r}; native: {', '.join(NATIVE_MODEL_TYPES)}")
    gemma = model_type.startswith("gemma3")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    num_layers = cfg.num_hidden_layers
    layer_types = getattr(cfg, "layer_types", None)
    sliding_window = getattr(cfg, "sliding_window", None)
    if model_type == "qwen2" or model_type == "qwen3":
        # Qwen only slides when use_sliding_window is set, and then only on layers >= max_window_layers.
        if not getattr(cfg, "use_sliding_window", False):
            sliding_window = None
    if layer_types is None:
        kind = "sliding_attention" if sliding_window else "full_attention"
        layer_types = [kind] * num_layers
    if sliding_window is None:
        layer_types = ["full_attention"] * num_layers
    if gemma:
        attn_scale = cfg.query_pre_attn_scalar**-0.5
    else:
        attn_scale = head_dim**-0.5
    activation = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    if activation in ("gelu_pytorch_tanh", "gelu_tanh"):
        activation = "gelu_tanh"
    elif activation != "silu":
        raise ValueError(f"unsupported activation {activation!r} for {model_type}")
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    return Architecture(
        model_type=model_type,
        hidden_size=cfg.hidden_size,
        num_layers=num_layers,
        intermediate_size=cfg.intermediate_size,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps,
        activation=activation,
        gemma_norm=gemma,
        qk_norm=gemma or model_type == "qwen3",
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        sandwich_norm=gemma,
        embed_scale=cfg.hidden_size**0.5 if gemma else None,
        attn_scale=attn_scale,
        layer_types=tuple(layer_types),
        sliding_window=sliding_window,
        final_logit_softcap=getattr(cfg, "final_logit_softcapping", None),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False))),
    )
