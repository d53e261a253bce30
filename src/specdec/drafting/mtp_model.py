"""DeepSeek-V3 style multi-token-prediction (MTP) modules (arXiv:2412.19437) as drafters.

Depth k at position i reads the previous depth's hidden state h^{k-1}_i (depth 1: the target's final
normed hidden state) and the embedding of token t_{i+k}, and predicts t_{i+k+1}:

    x_i   = eh_proj(cat(enorm(Emb(t_{i+k})), hnorm(h^{k-1}_i)))     (embedding first, as checkpoints store it)
    h^k   = TRM_k(x)                     one decoder layer of the target's family, causal over depth k's positions
    p     = softmax(head(shared_head.norm(h^k_i)))     the target's LM head (rows of the draft vocabulary)

A drafter holds `num_modules` modules; depth k uses module min(k, num_modules), so one module can serve
several draft steps. The block is our own DecoderLayer, so inference runs exactly the target family's
layer (norm conventions, RoPE tables, windows) over a KVCache; `train_block` is its autograd twin.
Tensors are named as DeepSeek-V3 checkpoints name them (`model.layers.{L + m}.*`, L = trunk layers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafting.int8_weights import Int8Copies, shape_problems
from specdec.drafting.vocab_map import DraftVocab, head_logits
from specdec.models.architecture import Architecture
from specdec.models.decoder import Decoder, DecoderLayer, apply_rope, norm_scale, rms_norm
from specdec.models.fast_linear import linear
from specdec.models.native import layer_state_dict, layer_to_hf
from specdec.quantization.quantized_weight import QuantizedLinear, QuantizedWeight

FULL = "full_attention"


@dataclass
class MTPConfig:
    num_modules: int
    hidden_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    first_layer_index: int  # the target's num_hidden_layers: module m is stored as model.layers.{first + m}
    layer_type: str = FULL  # attention kind of the block ("full_attention" or "sliding_attention")

    def to_dict(self) -> dict:
        return asdict(self)


def make_block(arch: Architecture, layer_type: str) -> DecoderLayer:
    """A decoder layer of the target's family that writes layer 0 of its own one-layer KVCache."""
    index = arch.layer_types.index(layer_type) if layer_type in arch.layer_types else 0
    block = DecoderLayer(arch, index)
    block.index = 0
    block.window = arch.sliding_window if layer_type == "sliding_attention" else None
    return block


class MTPModule(nn.Module):
    def __init__(self, arch: Architecture, layer_type: str) -> None:
        super().__init__()
        self.arch = arch
        h, one = arch.hidden_size, 0.0 if arch.gemma_norm else 1.0  # Gemma scales by (1 + w)
        self.enorm = nn.Parameter(torch.full((h,), one))
        self.hnorm = nn.Parameter(torch.full((h,), one))
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_norm = nn.Parameter(torch.full((h,), one))  # shared_head.norm
        self.block = make_block(arch, layer_type)
        for name in ("input_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm", "q_norm", "k_norm"):
            if hasattr(self.block, name):
                getattr(self.block, name).data.fill_(one)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        a = self.arch
        return rms_norm(x, norm_scale(weight, a.gemma_norm), a.rms_norm_eps, a.gemma_norm)

    def project(self, embedded: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.norm(embedded, self.enorm), self.norm(hidden, self.hnorm)], dim=-1)
        if torch.is_grad_enabled():
            return self.eh_proj(x)
        return linear(x.to(self.eh_proj.weight.dtype), self.eh_proj.weight)


class MTPDrafter(DraftVocab):
    def __init__(self, config: MTPConfig, arch: Architecture) -> None:
        super().__init__()
        if arch.hidden_size != config.hidden_size:
            raise ValueError(f"MTP hidden size {config.hidden_size} != target's {arch.hidden_size}")
        self.config, self.arch = config, arch
        self.layers = nn.ModuleList(MTPModule(arch, config.layer_type) for _ in range(config.num_modules))
        self._init_draft_vocab(config.vocab_size, config.draft_vocab_size)
        self._target: tuple[Decoder, torch.Tensor] | None = None  # a tuple, so the target is no submodule
        self.int8_head: QuantizedWeight | None = None  # use_int8_weights

    def module_for(self, depth: int) -> MTPModule:
        """Depth k (1-based) uses module k; deeper steps reuse the last one."""
        return self.layers[min(depth, len(self.layers)) - 1]  # type: ignore[return-value]

    def attach_target(self, decoder: Decoder, head_dtype: torch.dtype | None = None) -> None:
        """The target's embedding, RoPE tables and LM head rows (frozen, shared, never saved); `head_dtype`
        as in `head_rows`."""
        self._target = (decoder, self.head_rows(decoder.head_weight(), head_dtype))

    @property
    def target(self) -> Decoder:
        if self._target is None:
            raise RuntimeError("attach_target() first: MTP modules use the target's embedding and LM head")
        return self._target[0]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.target.embed_tokens(tokens)

    def logits(self, module: MTPModule, h: torch.Tensor) -> torch.Tensor:
        assert self._target is not None
        return head_logits(module.norm(h, module.shared_norm), self._target[1], self.arch.final_logit_softcap)

    def rope(self, positions: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, 1, head_dim] of the block's attention kind, in the target's dtype."""
        rope = self.target.rope
        table = rope[self.config.layer_type] if self.config.layer_type in rope else next(iter(rope.values()))
        table.ensure(length, self.target.dtype)
        return table.cos[positions][:, None], table.sin[positions][:, None]

    def prepare(self) -> MTPDrafter:
        """Call after loading weights (inference): precomputes the blocks' norm scales."""
        for m in self.layers:
            m.block.prepare()  # type: ignore[operator]
        return self

    def int8_problems(self) -> list[str]:
        """Why use_int8_weights cannot apply to this drafter's shapes (none: it can)."""
        a = self.arch
        return shape_problems([a.hidden_size, a.num_heads * a.head_dim, a.intermediate_size])

    def use_int8_weights(self) -> MTPDrafter:
        """Inference only, from here on: each block's four linears on int8 copies (drafting/int8_weights.py;
        the blocks are our DecoderLayer, whose one-call layer runs quantized linears as a quantized target's
        do) and the head rows' int8 copy in `int8_head` for the draft-vocabulary logits. `eh_proj` stays
        bfloat16, as EAGLE-3's `fc`: its input carries the target's final hidden state."""
        problems = self.int8_problems()
        if problems:
            raise ValueError(problems[0])
        copies = Int8Copies()
        for i, m in enumerate(self.layers):
            block = m.block
            for name in ("qkv", "o", "gate_up", "down"):
                dense: nn.Linear = getattr(block, name)
                setattr(block, name, QuantizedLinear(copies.of(f"{i}.{name}", dense.weight), dense.bias))
            block.prepare()  # type: ignore[operator]
        assert self._target is not None
        self.int8_head = copies.of("head", self._target[1])
        return self

    # -- DeepSeek checkpoint names ---------------------------------------------------------------------
    def to_checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        sd = self.state_dict()
        out: dict[str, torch.Tensor] = {"d2t": sd["d2t"], "t2d": sd["t2d"]}
        for m in range(self.config.num_modules):
            ours, theirs = f"layers.{m}.", f"model.layers.{self.config.first_layer_index + m}."
            out[theirs + "enorm.weight"] = sd[ours + "enorm"]
            out[theirs + "hnorm.weight"] = sd[ours + "hnorm"]
            out[theirs + "eh_proj.weight"] = sd[ours + "eh_proj.weight"]
            out[theirs + "shared_head.norm.weight"] = sd[ours + "shared_norm"]
            out.update(layer_to_hf(sd, self.arch, ours + "block.", theirs))
        return out

    def load_checkpoint_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Loads modules stored as model.layers.{first + m}.* (the checkpoint's shared_head.head and
        embed_tokens copies are ignored: the target's own are used)."""
        sd: dict[str, torch.Tensor] = {}
        for m in range(self.config.num_modules):
            ours, theirs = f"layers.{m}.", f"model.layers.{self.config.first_layer_index + m}."
            missing = [n for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
                       if theirs + n not in tensors]
            if missing:
                raise ValueError(f"MTP module {m} lacks {', '.join(theirs + n for n in missing)}")
            sd[ours + "enorm"] = tensors[theirs + "enorm.weight"]
            sd[ours + "hnorm"] = tensors[theirs + "hnorm.weight"]
            sd[ours + "eh_proj.weight"] = tensors[theirs + "eh_proj.weight"]
            sd[ours + "shared_norm"] = tensors[theirs + "shared_head.norm.weight"]
            sd.update(layer_state_dict(tensors, self.arch, theirs, ours + "block."))
        sd["d2t"] = tensors.get("d2t", self.d2t)
        sd["t2d"] = tensors.get("t2d", self.t2d)
        self.load_state_dict(sd)


def train_block(block: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DecoderLayer.forward over a whole sequence [T, H] with causal (and windowed) attention, with
    autograd: norm scales from the live parameters, F.linear instead of the inference kernels."""
    a, t = block.arch, x.shape[0]

    def norm(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(v, norm_scale(weight, a.gemma_norm), a.rms_norm_eps, a.gemma_norm)

    h = x
    y = norm(h, block.input_norm)
    qkv = F.linear(y, block.qkv.weight, block.qkv.bias).view(t, a.num_heads + 2 * a.num_kv_heads, a.head_dim)
    q, k, v = qkv.split([a.num_heads, a.num_kv_heads, a.num_kv_heads], dim=1)
    if a.qk_norm:
        q, k = norm(q, block.q_norm), norm(k, block.k_norm)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    groups = a.num_heads // a.num_kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # head h reads kv head h // groups
    scores = torch.einsum("qhd,khd->hqk", q, k).float() * a.attn_scale
    i = torch.arange(t, device=x.device)
    allowed = i[None, :] <= i[:, None]
    if block.window is not None:
        allowed &= (i[:, None] - i[None, :]) < block.window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).to(v.dtype)
    attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(t, a.num_heads * a.head_dim)
    attn = F.linear(attn, block.o.weight, block.o.bias)
    if a.sandwich_norm:
        h = h + norm(attn, block.post_attn_norm)
        y = norm(h, block.pre_ffn_norm)
    else:
        h = h + attn
        y = norm(h, block.post_attn_norm)
    gate, up = F.linear(y, block.gate_up.weight, block.gate_up.bias).chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if a.activation == "gelu_tanh" else F.silu(gate)
    out = F.linear(act * up, block.down.weight, block.down.bias)
    if a.sandwich_norm:
        out = norm(out, block.post_ffn_norm)
    return h + out


def unroll(drafter: MTPDrafter, ids: torch.Tensor, final_hidden: torch.Tensor, depths: int) -> list[torch.Tensor]:
    """Training forward: depth k's hidden states h^k [T - 1 - k, H] at positions 0..T-2-k (the ones with
    a label t_{i+k+1}), each depth reading the one before over the whole sequence in parallel."""
    out: list[torch.Tensor] = []
    h = final_hidden
    for k in range(1, depths + 1):
        n = ids.shape[0] - 1 - k
        if n <= 0:
            break
        module = drafter.module_for(k)
        x = module.project(drafter.embed(ids[k : k + n]).to(h.dtype), h[:n])
        cos, sin = drafter.rope(torch.arange(n, device=ids.device), n)
        h = train_block(module.block, x, cos, sin)
        out.append(h)
    return out


def init_from_target(drafter: MTPDrafter, decoder: Decoder, layer: int | None) -> None:
    """Starts every module's shared_head.norm from the target's final norm (its scale sets the logits'
    temperature) and, unless `layer` is None, its block from that target layer rather than random."""
    source = None if layer is None else decoder.layers[layer].state_dict()
    with torch.no_grad():
        for m in drafter.layers:
            m.shared_norm.copy_(decoder.final_norm)  # type: ignore[union-attr]
            if source is not None:
                m.block.load_state_dict(source)  # type: ignore[union-attr]  (copies into the drafter's dtype)

