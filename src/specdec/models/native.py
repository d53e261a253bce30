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


def layer_state_dict(
    sd: dict[str, torch.Tensor], arch: Architecture, src: str, dst: str = ""
) -> dict[str, torch.Tensor]:
    """One decoder layer's transformers weights under `src` (e.g. "model.layers.3.") in our DecoderLayer's
    names under `dst`, q/k/v and gate/up fused. Also used for the MTP layers stored after the trunk's."""
    out: dict[str, torch.Tensor] = {}
    attn, mlp = src + "self_attn.", src + "mlp."
    out[dst + "qkv.weight"] = torch.cat([sd[attn + f"{n}_proj.weight"] for n in "qkv"])
    if arch.qkv_bias:
        out[dst + "qkv.bias"] = torch.cat([sd[attn + f"{n}_proj.bias"] for n in "qkv"])
    out[dst + "o.weight"] = sd[attn + "o_proj.weight"]
    if arch.o_bias:
        out[dst + "o.bias"] = sd[attn + "o_proj.bias"]
    out[dst + "gate_up.weight"] = torch.cat([sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]])
    out[dst + "down.weight"] = sd[mlp + "down_proj.weight"]
    if arch.mlp_bias:
        out[dst + "gate_up.bias"] = torch.cat([sd[mlp + "gate_proj.bias"], sd[mlp + "up_proj.bias"]])
        out[dst + "down.bias"] = sd[mlp + "down_proj.bias"]
    out[dst + "input_norm"] = sd[src + "input_layernorm.weight"]
    out[dst + "post_attn_norm"] = sd[src + "post_attention_layernorm.weight"]
    if arch.sandwich_norm:
        out[dst + "pre_ffn_norm"] = sd[src + "pre_feedforward_layernorm.weight"]
        out[dst + "post_ffn_norm"] = sd[src + "post_feedforward_layernorm.weight"]
    if arch.qk_norm:
        out[dst + "q_norm"] = sd[attn + "q_norm.weight"]
        out[dst + "k_norm"] = sd[attn + "k_norm.weight"]
    return out


def layer_to_hf(ours: dict[str, torch.Tensor], arch: Architecture, src: str, dst: str) -> dict[str, torch.Tensor]:
    """The inverse of layer_state_dict: our fused names under `src` -> transformers' names under `dst`."""
    q, kv, inter = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    attn, mlp = dst + "self_attn.", dst + "mlp."
    out: dict[str, torch.Tensor] = {}
    for kind in ("weight", "bias"):
        if src + f"qkv.{kind}" in ours:
            for name, part in zip("qkv", ours[src + f"qkv.{kind}"].split([q, kv, kv])):
                out[attn + f"{name}_proj.{kind}"] = part
        if src + f"gate_up.{kind}" in ours:
            gate, up = ours[src + f"gate_up.{kind}"].split([inter, inter])
            out[mlp + f"gate_proj.{kind}"], out[mlp + f"up_proj.{kind}"] = gate, up
        if src + f"o.{kind}" in ours:
            out[attn + f"o_proj.{kind}"] = ours[src + f"o.{kind}"]
        if src + f"down.{kind}" in ours:
            out[mlp + f"down_proj.{kind}"] = ours[src + f"down.{kind}"]
    names = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
             "pre_ffn_norm": "pre_feedforward_layernorm", "post_ffn_norm": "post_feedforward_layernorm",
             "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
    for mine, theirs in names.items():
        if src + mine in ours:
            out[dst + theirs + ".weight"] = ours[src + mine]
    return {k: v.contiguous() for k, v in out.items()}


def _native_state_dict(sd: dict[str, torch.Tensor], arch: Architecture) -> dict[str, torch.Tensor]:
    """Renames (and fuses) transformers' weights into our Decoder's parameter names."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "final_norm": sd["model.norm.weight"]}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    for i in range(arch.num_layers):
        out.update(layer_state_dict(sd, arch, f"model.layers.{i}.", f"layers.{i}."))
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
