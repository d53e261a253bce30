"""Builds our Decoder from a loaded transformers model: same weights, fused where it saves calls."""

from __future__ import annotations

from typing import Any

import torch

from specdec.models.architecture import Architecture, architecture_from_config
from specdec.models.decoder import Decoder, RopeTable


def _rope_tables(hf_model: Any, arch: Architecture) -> dict[str, tuple[torch.Tensor, float]]:
    """inv_freq and attention scaling per layer type, taken from the HF rotary module so that every RoPE
    variant transformers implements (linear, llama3, yarn, ...) is reproduced exactly."""
    rotary = hf_model.model.rotary_emb
    tables = {}
    for kind in sorted(set(arch.layer_types)):
        if hasattr(rotary, f"{kind}_inv_freq"):
            tables[kind] = (getattr(rotary, f"{kind}_inv_freq"), float(getattr(rotary, f"{kind}_attention_scaling")))
        else:
            tables[kind] = (rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)))
    if getattr(rotary, "rope_type", "default") == "dynamic":
        raise ValueError("dynamic RoPE scaling depends on the sequence length; use the transformers fallback")
    return {k: (v[0].detach().clone().float(), v[1]) for k, v in tables.items()}


def _native_state_dict(sd: dict[str, torch.Tensor], arch: Architecture) -> dict[str, torch.Tensor]:
    """Renames (and fuses) transformers' weights into our Decoder's parameter names."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "final_norm": sd["model.norm.weight"]}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    for i in range(arch.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        out[q + "qkv.weight"] = torch.cat([sd[attn + f"{n}_proj.weight"] for n in "qkv"])
        if arch.qkv_bias:
            out[q + "qkv.bias"] = torch.cat([sd[attn + f"{n}_proj.bias"] for n in "qkv"])
        out[q + "o.weight"] = sd[attn + "o_proj.weight"]
        if arch.o_bias:
            out[q + "o.bias"] = sd[attn + "o_proj.bias"]
        out[q + "gate_up.weight"] = torch.cat([sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]])
        out[q + "down.weight"] = sd[mlp + "down_proj.weight"]
        if arch.mlp_bias:
            out[q + "gate_up.bias"] = torch.cat([sd[mlp + "gate_proj.bias"], sd[mlp + "up_proj.bias"]])
            out[q + "down.bias"] = sd[mlp + "down_proj.bias"]
        out[q + "input_norm"] = sd[p + "input_layernorm.weight"]
        out[q + "post_attn_norm"] = sd[p + "post_attention_layernorm.weight"]
        if arch.sandwich_norm:
            out[q + "pre_ffn_norm"] = sd[p + "pre_feedforward_layernorm.weight"]
            out[q + "post_ffn_norm"] = sd[p + "post_feedforward_layernorm.weight"]
        if arch.qk_norm:
            out[q + "q_norm"] = sd[attn + "q_norm.weight"]
            out[q + "k_norm"] = sd[attn + "k_norm.weight"]
    return {k: v.detach().clone() for k, v in out.items()}


def decoder_from_hf(hf_model: Any) -> Decoder:
    arch = architecture_from_config(hf_model.config)
    with torch.device("meta"):
        decoder = Decoder(arch, {})
    decoder.load_state_dict(_native_state_dict(hf_model.state_dict(), arch), strict=True, assign=True)
    device = decoder.embed.weight.device
    decoder.rope = {
        kind: RopeTable(inv.to(device), scale, torch.empty(0, device=device), torch.empty(0, device=device))
        for kind, (inv, scale) in _rope_tables(hf_model, arch).items()
    }
    for param in decoder.parameters():
        param.requires_grad_(False)
    return decoder.eval().prepare()
