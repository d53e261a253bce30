"""Our own decoder for the native families (see architecture.py), in plain torch.

It computes what the transformers implementation computes, op for op in the same dtype (where our CPU
kernels run the linears, attention and RMSNorm, each in a fixed order of its own: float32 rounding may
differ from transformers', never between rows or batch sizes), but over a preallocated KVCache with an
explicit mask, with q/k/v and gate/up projections fused, and
without per-call Python overhead that does not matter for one sequence. The token axis is the leading
one ([T, hidden]); a batch of sequences is their rows one after another, with attention run per sequence
over its own cache (`forward_batch`), so a sequence's numbers never depend on what shares its forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.architecture import Architecture
from specdec.models import fast_linear
from specdec.models.fast_linear import linear, linear_float
from specdec.models.gated_activation import gated_activation
from specdec.models.column_screen import MAX_ROWS, PACKED_MAX_ROWS, column_screen, screened_max
from specdec.models.greedy_argmax import fused_greedy_argmax, greedy_argmax, head_screen
from specdec.models.kv_cache import KVCache
from specdec.models.packed_head import PackedHead


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """RMSNorm over the last axis, rounding as transformers does for each family.

    `scale` comes from `norm_scale`: (1 + w) in float32 for Gemma, which multiplies before the cast back;
    w itself for the Llama family, which casts first. bfloat16 on CPU without autograd runs in one kernel
    call (kernels/avx2_rms_norm.cpp: the same steps, the mean summed in a fixed order of its own, so float32
    rounding may differ from torch's by an ulp); elsewhere torch's ops.
    """
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.is_grad_enabled():
        k = fast_linear.kernel()
        if k is not None and hasattr(k, "rms_norm_rows") and scale.dim() <= 2 and x.stride(-1) == 1:
            return k.rms_norm_rows(x, scale if gemma else scale.to(torch.bfloat16), eps, gemma)
    h = F.rms_norm(x.float(), (x.shape[-1],), None, eps)  # same bits as x * rsqrt(mean(x^2) + eps), one op
    if gemma:
        return (h * scale).type_as(x)
    return scale * h.to(x.dtype)


def norm_scale(weight: torch.Tensor, gemma: bool) -> torch.Tensor:
    return (1.0 + weight.float()) if gemma else weight


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched a @ b, a single row run as two (the GEMV/GEMM rounding difference of fast_linear.py)."""
    if a.shape[-2] == 1:
        return torch.matmul(a.expand(*a.shape[:-2], 2, a.shape[-1]), b)[..., :1, :]
    return torch.matmul(a, b)


def _kernel_probs_values(probs: torch.Tensor, values: torch.Tensor, order: torch.Tensor | None,
                         tokens: int) -> torch.Tensor | None:
    """probs [kv_heads, groups * T, capacity] @ values through our CPU kernel (kernels/avx2_probs_values.cpp),
    or None where it does not apply (not bfloat16 on CPU, or no
    kernel: then torch's path below, exact too)."""
    if probs.dtype != torch.bfloat16 or probs.device.type != "cpu":
        return None
    k = fast_linear.kernel()
    if k is None:
        return None
    return k.probs_values(probs, values, order if order is not None else _NO_ORDER, tokens)


_NO_ORDER = torch.empty(0, dtype=torch.long)
_NO_MASK = torch.empty(0)


def attention(
    q: torch.Tensor,  # [T, heads, head_dim]
    keys_t: torch.Tensor,  # [kv_heads, head_dim, capacity] (stored transposed)
    values: torch.Tensor,  # [kv_heads, capacity, head_dim]
    mask: torch.Tensor,  # [groups * T, capacity] float32, 0 or -inf, rows ordered (group, token)
    scale: float,
    order: torch.Tensor | None = None,  # [T, capacity] slot read at each column, per token (draft trees)
) -> torch.Tensor:
    """Masked attention over the whole cache buffer; returns [T, heads * head_dim].

    Query heads that share a KV head are stacked as extra rows, so grouped-query attention needs no
    copy of the cache. Softmax runs in float32, as in transformers' eager attention (with the kernels, their
    softmax_rows: each column summed into the lane of its slot, so a row's bits do not depend on the span).

    With `order` (a draft tree), token i reads its columns in its own slot order, which puts its ancestors
    at the slots a chain would give them (`tree_slot_order`), and `mask` is in that order too. The float
    sums of the softmax and of probs x values then group their terms exactly as plain decoding does, so a
    tree node's output is bit-identical to the same token decoded alone. Where our CPU kernels exist
    (fast_linear.kernel()), probs x values runs in them, reading each token's slots in
    its order without copying the values; elsewhere torch gathers a copy of the values per token (slower
    for trees, as exact). The kernels also compute the scores (`qk_scores`): each a float32 dot
    product in a fixed order, not rounded to bfloat16 as torch's bfloat16 matmul rounds it.
    """
    t, heads, dim = q.shape
    kv_heads = keys_t.shape[0]
    groups = heads // kv_heads
    q = q.view(t, kv_heads, groups, dim).permute(1, 2, 0, 3).reshape(kv_heads, groups * t, dim)
    k = fast_linear.kernel() if q.dtype == torch.bfloat16 and q.device.type == "cpu" else None
    if k is not None and hasattr(k, "qk_scores"):
        scores = k.qk_scores(q, keys_t).mul_(scale)
    else:
        scores = matmul(q, keys_t).float().mul_(scale)
    if order is not None:
        scores = scores.gather(-1, order.repeat(groups, 1).expand(kv_heads, -1, -1))
    if k is not None and hasattr(k, "softmax_rows") and scores.dtype == torch.float32:
        probs = k.softmax_rows(scores.add_(mask), 0)  # column c is slot c (or a tree's column c)
    else:
        probs = scores.add_(mask).softmax(dim=-1).to(values.dtype)
    pv = _kernel_probs_values(probs, values, order, t)
    if pv is not None:  # every row a fixed-order sum over its own slot order: no per-token value copies
        return pv.view(kv_heads, groups, t, dim).permute(2, 0, 1, 3).reshape(t, heads * dim)
    if order is None:
        out = matmul(probs, values)  # [kv_heads, groups * t, dim]
        return out.view(kv_heads, groups, t, dim).permute(2, 0, 1, 3).reshape(t, heads * dim)
    per_token = probs.view(kv_heads, groups, t, -1).transpose(1, 2)  # [kv_heads, t, groups, capacity]
    out = matmul(per_token.contiguous(), values[:, order])  # values per token: [kv_heads, t, capacity, dim]
    return out.permute(1, 0, 2, 3).reshape(t, heads * dim)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) * sin == roll(x, half) * [-sin1, sin2] (exact:
    negation commutes with rounding), which takes four ops instead of seven. x [T, G, D] bfloat16 on the CPU
    with the kernels: one call (kernels/avx2_rope.cpp), the same three roundings, the same bits."""
    rows = x.shape[0] * x.shape[2] if x.dim() == 3 else -1
    if (x.dtype == cos.dtype == signed_sin.dtype == torch.bfloat16 and x.device.type == "cpu" and rows >= 0
            and x.stride(-1) == 1 and cos.numel() == signed_sin.numel() == rows
            and not (torch.is_grad_enabled() and x.requires_grad)):
        k = fast_linear.kernel()
        if k is not None and hasattr(k, "rope_rows"):
            return k.rope_rows(x, cos, signed_sin)
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


@dataclass
class RopeTable:
    """cos/sin for positions [0, len) of one rotary configuration, already in the model dtype."""

    inv_freq: torch.Tensor
    scaling: float
    cos: torch.Tensor
    sin: torch.Tensor  # first half negated, see apply_rope

    def ensure(self, length: int, dtype: torch.dtype) -> None:
        if self.cos.shape[0] >= length:
            return
        positions = torch.arange(length, device=self.inv_freq.device, dtype=torch.float)
        freqs = positions[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * self.scaling).to(dtype)
        sin = (emb.sin() * self.scaling).to(dtype)
        half = sin.shape[-1] // 2
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def _row_indices(rows: torch.Tensor | slice | None, start: int, size: int) -> torch.Tensor | None:
    """A sequence's logit rows (a slice or indices into its own T rows) as indices into the batch."""
    if rows is None:
        return None
    if isinstance(rows, slice):
        return torch.arange(size)[rows] + start
    return rows.cpu() + start


class DecoderLayer(nn.Module):
    def __init__(self, arch: Architecture, index: int) -> None:
        super().__init__()
        a = arch
        self.arch, self.index, self.window = a, index, a.window(index)
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        self.split = (q, kv, kv)
        self.qkv = nn.Linear(a.hidden_size, q + 2 * kv, bias=a.qkv_bias)
        self.o = nn.Linear(q, a.hidden_size, bias=a.o_bias)
        self.gate_up = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=a.mlp_bias)
        self.down = nn.Linear(a.intermediate_size, a.hidden_size, bias=a.mlp_bias)
        self.input_norm = nn.Parameter(torch.zeros(a.hidden_size))
        self.post_attn_norm = nn.Parameter(torch.zeros(a.hidden_size))  # pre-MLP norm in Llama naming
        if a.sandwich_norm:
            self.pre_ffn_norm = nn.Parameter(torch.zeros(a.hidden_size))
            self.post_ffn_norm = nn.Parameter(torch.zeros(a.hidden_size))
        if a.qk_norm:
            self.q_norm = nn.Parameter(torch.zeros(a.head_dim))
            self.k_norm = nn.Parameter(torch.zeros(a.head_dim))

    def prepare(self) -> None:
        """Precomputes norm scales (and fuses the q and k norms) once the weights are final."""
        a, gemma = self.arch, self.arch.gemma_norm
        names = ["input_norm", "post_attn_norm"] + (["pre_ffn_norm", "post_ffn_norm"] if a.sandwich_norm else [])
        self.scales = {n: norm_scale(getattr(self, n), gemma) for n in names}
        if a.qk_norm:
            q = norm_scale(self.q_norm, gemma).expand(a.num_heads, -1)
            k = norm_scale(self.k_norm, gemma).expand(a.num_kv_heads, -1)
            self.scales["qk_norm"] = torch.cat([q, k])  # [heads + kv_heads, head_dim]
        for name in ("qkv", "o", "gate_up", "down"):  # inference weights packed for the kernels (not while training)
            weight = getattr(self, name).weight
            if isinstance(weight, torch.Tensor) and not weight.requires_grad:
                fast_linear.pack_weight(weight)
        self.layer_call_args = self._layer_call_args()

    def _layer_call_args(self) -> tuple | None:
        """decoder_layer_call's weight arguments (the linear's address, tiles, kinds, out_features, norm
        scales, and for packed bfloat16 weights the weights with their copies, checked before each call) when the
        four linears have no biases and are all quantized (QuantizedWeight, the quantized kernel built here) or
        all bfloat16 weights, all packed (fast_linear.pack_weight) or all as they are; else None."""
        linears = [getattr(self, name) for name in ("qkv", "o", "gate_up", "down")]
        if any(m.bias is not None for m in linears):
            return None
        empty = torch.empty(0)
        tiles, kinds, packed = [], [], []
        if all(hasattr(m.weight, "kernel_args") for m in linears):
            addresses = set()
            for m in linears:
                t, kind, address = m.weight.kernel_args()
                tiles += list(t)
                kinds.append(kind)
                addresses.add(address)
            if len(addresses) != 1 or 0 in addresses:
                return None
            address = addresses.pop()
        else:
            weights = [m.weight for m in linears]
            arguments = fast_linear.layer_linear_arguments(weights)
            if arguments is None:
                return None
            address, tiles = arguments
            kinds = [w.shape[0] for w in weights]
            packed = [(w, c) for w in weights if (c := fast_linear.packed_copy(w)) is not None]
        gemma = self.arch.gemma_norm
        # as rms_norm passes them to the kernel: float32 (1 + w) for Gemma, bfloat16 w otherwise
        scale = (lambda name: empty if name not in self.scales else
                 self.scales[name] if gemma else self.scales[name].to(torch.bfloat16))
        norms = [scale(n) for n in ("input_norm", "qk_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm")]
        return address, tiles, kinds, [m.weight.shape[0] for m in linears], norms, packed

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return rms_norm(x, self.scales[name], self.arch.rms_norm_eps, self.arch.gemma_norm)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,
        mask: torch.Tensor,  # [groups * T, capacity] float32 additive
        cache: KVCache,
        order: torch.Tensor | None = None,  # [T, capacity] per-token slot order (draft trees), see attention
        positions: torch.Tensor | None = None,  # [T]; None: a chain after the cache's committed tokens
    ) -> torch.Tensor:
        """One sequence's rows (the MTP drafter runs its block this way)."""
        if positions is None:
            positions = torch.arange(cache.length, cache.length + h.shape[0], device=h.device)
        return self.forward_batch(h, cos, sin, [SequenceRows(0, h.shape[0], cache, {self.window: mask}, order)],
                                  positions)

    def forward_batch(
        self,
        h: torch.Tensor,  # [N, hidden]: the rows of every sequence, one after another
        cos: torch.Tensor,  # [N, 1, head_dim]
        sin: torch.Tensor,
        sequences: Sequence[SequenceRows],
        positions: torch.Tensor,  # [N] each row's position (the attention kernel's spans follow a tree's depths)
    ) -> torch.Tensor:
        """Projections and MLP over all rows at once (row-invariant linears: a row's result does not depend
        on its neighbours), attention per sequence over its own cache exactly as when it runs alone."""
        a, t = self.arch, h.shape[0]
        fused = self._one_call(h, cos, sin, sequences, positions)
        if fused is not None:
            return fused
        x = self.norm(h, "input_norm")
        qkv = linear(x, self.qkv.weight, self.qkv.bias).view(t, a.num_heads + 2 * a.num_kv_heads, a.head_dim)
        qk, v = qkv[:, : a.num_heads + a.num_kv_heads], qkv[:, a.num_heads + a.num_kv_heads :]
        if a.qk_norm:
            qk = self.norm(qk, "qk_norm")
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, : a.num_heads], qk[:, a.num_heads :]
        kern = fast_linear.kernel() if q.dtype == torch.bfloat16 and q.device.type == "cpu" else None
        if kern is not None and hasattr(kern, "attention_batch"):  # the loop below, in one C++ call
            buffers = [s.cache.layer(self.index, s.end - s.start) for s in sequences]
            tiled = [s.cache.tile_buffers(self.index) for s in sequences]  # the AMX build's (kv_cache.py), or empty
            attn = kern.attention_batch(
                q, k, v, [b[0] for b in buffers], [b[1] for b in buffers],
                [s.masks.get(self.window, _NO_MASK) for s in sequences],  # none: a chain, the kernel's own mask
                [s.order if s.order is not None else _NO_ORDER for s in sequences],
                [s.start for s in sequences], [s.end for s in sequences], [s.cache.length for s in sequences],
                positions, -1 if self.window is None else self.window, a.attn_scale,
                [t[0] for t in tiled], [t[1] for t in tiled])
        else:
            parts = []
            for s in sequences:
                keys_t, values = s.cache.write(self.index, k[s.start : s.end], v[s.start : s.end])
                parts.append(attention(q[s.start : s.end], keys_t, values, s.masks[self.window], a.attn_scale,
                                       s.order))
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
        attn = linear(attn, self.o.weight, self.o.bias)
        if a.sandwich_norm:
            h = h + self.norm(attn, "post_attn_norm")
            x = self.norm(h, "pre_ffn_norm")
        else:
            h = h + attn
            x = self.norm(h, "post_attn_norm")
        act_up = gated_activation(linear(x, self.gate_up.weight, self.gate_up.bias), a.activation)
        out = linear(act_up, self.down.weight, self.down.bias)
        if a.sandwich_norm:
            out = self.norm(out, "post_ffn_norm")
        return h + out

    def _one_call(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sequences: Sequence[SequenceRows],
                  positions: torch.Tensor) -> torch.Tensor | None:
        """forward_batch in one C++ call (kernels/avx2_decoder_layer.cpp: the same kernels in the same order,
        the same bits) where the layer's linears are quantized or packed bfloat16 and every step below would
        take its kernel; None elsewhere (then the steps below run)."""
        args = getattr(self, "layer_call_args", None)
        if args is None or h.dtype != torch.bfloat16 or h.device.type != "cpu" or torch.is_grad_enabled():
            return None
        a = self.arch
        kern = fast_linear.kernel()
        if (kern is None or not hasattr(kern, "decoder_layer_call") or cos.dtype != torch.bfloat16
                or cos.numel() != h.shape[0] * a.head_dim or a.activation not in ("gelu_tanh", "silu")):
            return None
        address, tiles, kinds, out_features, norms, packed = args
        # a bfloat16 weight changed since it was packed (a fine-tune in place) would read a stale copy: the
        # Python path, which packs it again, runs instead (weights taken as they are are read as they are now)
        if any(fast_linear.packed_copy(w) is not copy for w, copy in packed):
            return None
        buffers = [s.cache.layer(self.index, s.end - s.start) for s in sequences]
        tiled = [s.cache.tile_buffers(self.index) for s in sequences]
        return kern.decoder_layer_call(
            h, address, tiles, kinds, out_features, norms, a.rms_norm_eps, a.gemma_norm,
            a.activation == "gelu_tanh", [a.num_heads, a.num_kv_heads, a.head_dim], cos, sin,
            [b[0] for b in buffers], [b[1] for b in buffers],
            [s.masks.get(self.window, _NO_MASK) for s in sequences],
            [s.order if s.order is not None else _NO_ORDER for s in sequences],
            [s.start for s in sequences], [s.end for s in sequences], [s.cache.length for s in sequences],
            positions, -1 if self.window is None else self.window, a.attn_scale,
            [t[0] for t in tiled], [t[1] for t in tiled])


@dataclass
class SequenceRows:
    """Where one sequence's rows sit in a batched forward, and what its attention reads."""

    start: int
    end: int
    cache: KVCache
    masks: dict[int | None, torch.Tensor]  # window -> [groups * T, capacity] float32 additive
    order: torch.Tensor | None = None  # [T, capacity] per-token slot order of a draft tree


@dataclass
class DecoderInput:
    """One sequence's part of a (batched) decoder forward."""

    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    masks: dict[int | None, torch.Tensor]  # window -> [T, capacity] bool; empty for a chain the kernel masks
    cache: KVCache
    capture: Sequence[int] = ()
    logit_rows: torch.Tensor | slice | None = field(default_factory=lambda: slice(None))
    order: torch.Tensor | None = None  # [T, capacity] per-token slot order of a draft tree
    argmax: bool = False  # also the greedy token of each logit row (one call for the whole batch)
    logits: bool = True  # False: only `argmax` is read, the logits may be left out (requires argmax)


@dataclass
class DecoderOutput:
    logits: torch.Tensor | None  # [R, vocab] float32, R = rows asked for; None where the input took argmax only
    hidden: dict[int, torch.Tensor]  # residual stream entering layer i ([T, hidden]); i == num_layers: last layer's output
    final_hidden: torch.Tensor  # [T, hidden] after the final norm
    argmax: torch.Tensor | None = None  # [R] greedy_argmax(logits), when an input asked for it


class Decoder(nn.Module):
    """Embeddings, layers, final norm and LM head of a native-family causal LM."""

    def __init__(self, arch: Architecture, rope: dict[str, tuple[torch.Tensor, float]]) -> None:
        super().__init__()
        self.arch = arch
        self.embed = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.final_norm = nn.Parameter(torch.zeros(arch.hidden_size))
        self.lm_head = None if arch.tie_word_embeddings else nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        # a quantization.QuantizedWeight the LM head runs on instead of head_weight() (quantize_decoder sets
        # it); head_weight() stays the dense rows drafters borrow
        self.quantized_head = None
        self.packed_head: PackedHead | None = None  # the dense head in the kernels' panels (prepare() packs it)
        self.rope = {kind: RopeTable(inv, scale, torch.empty(0), torch.empty(0)) for kind, (inv, scale) in rope.items()}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        if self.arch.embed_scale is not None:
            h = h * torch.tensor(self.arch.embed_scale, dtype=h.dtype)
        return h

    def logits(self, hidden: torch.Tensor, columns: slice | torch.Tensor | None = None) -> torch.Tensor:
        """LM head over final-normed hidden states, returned in float32; `columns` (a slice or token ids)
        scores only those tokens."""
        runner = self.quantized_head if self.quantized_head is not None else self.packed_head
        if runner is not None:
            logits = runner.linear_float(hidden) if columns is None else runner.linear_columns(hidden, columns)
        else:
            weight = self.head_weight()
            logits = linear_float(hidden, weight if columns is None else weight[columns])
        cap = self.arch.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def head_max(self, hidden: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(values [n] float32, indices [n] int64 within `columns`): each row's greedy_argmax over
        logits(hidden, columns) and the logit there, where a quantized head's kernel finds them in its pass
        without writing the logits, or a dense bf16 head's int8 copy rules out all but a few columns
        (column_screen.py: up to its MAX_ROWS rows, without AMX); no softcap; else None. A plain decode step
        of the `int4` default model spent 3.4 ms in its head writing the logits and finding their argmax."""
        if self.arch.final_logit_softcap:
            return None
        if self.quantized_head is not None:
            return self.quantized_head.max_columns(hidden, columns)
        return screened_max(hidden, self.head_weight(), columns, self._screened_rows)

    @property
    def screens_head(self) -> bool:
        """Whether greedy_tokens rules out columns with the head's int8 copy (greedy_argmax.head_screen)."""
        fused = self.quantized_head is None and self.packed_head is None and not self.arch.final_logit_softcap
        return fused and head_screen(self.head_weight()) is not None

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """greedy_argmax(self.logits(hidden)) without the logits, where a fused head kernel computes exactly
        that (a dense bf16 head on the AMX kernels or, up to column_screen.MAX_ROWS rows, screened by its
        int8 copy elsewhere; or a quantized head; no softcap: tanh rounding can tie two logits); else None."""
        if self.arch.final_logit_softcap:
            return None
        if self.quantized_head is not None:  # as logits() picks its runner
            return self.quantized_head.greedy_rows(hidden)
        head = self.head_weight()
        fused = fused_greedy_argmax(hidden, head)
        if fused is not None:
            return fused
        found = screened_max(hidden, head, slice(0, head.shape[0]), self._screened_rows)
        return None if found is None else found[1]

    @property
    def _screened_rows(self) -> int:
        """The most rows the int8 screen takes (column_screen.py): fewer where the head is packed."""
        return PACKED_MAX_ROWS if self.packed_head is not None else MAX_ROWS

    def forward(
        self,
        tokens: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        masks: dict[int | None, torch.Tensor],  # window -> [T, capacity] bool
        cache: KVCache,
        capture: Sequence[int] = (),
        logit_rows: torch.Tensor | slice | None = slice(None),
        order: torch.Tensor | None = None,  # [T, capacity] per-token slot order of a draft tree
    ) -> DecoderOutput:
        """One sequence: a batch of one, through the same code as any batch."""
        return self.forward_batch([DecoderInput(tokens, positions, masks, cache, capture, logit_rows, order)])[0]

    def forward_batch(self, inputs: Sequence[DecoderInput]) -> list[DecoderOutput]:
        """Several sequences in one pass over the weights. Each sequence's outputs are bit-identical to its
        forward alone: linears and norms are per row, attention reads only the sequence's own cache."""
        if not inputs:
            return []
        sizes = [int(x.tokens.shape[0]) for x in inputs]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        tokens = inputs[0].tokens if len(inputs) == 1 else torch.cat([x.tokens for x in inputs])
        positions = inputs[0].positions if len(inputs) == 1 else torch.cat([x.positions for x in inputs])
        h = self.embed_tokens(tokens)
        end = int(positions.max()) + 1
        tables = {}
        for kind, table in self.rope.items():
            table.ensure(max(end, *(x.cache.capacity for x in inputs)), h.dtype)
            tables[kind] = (table.cos[positions][:, None], table.sin[positions][:, None])
        groups = self.arch.num_heads // self.arch.num_kv_heads
        # bool [T, C] -> additive float [groups * T, C], once per forward rather than per layer
        zero = torch.zeros((), dtype=torch.float32, device=h.device)
        rows = [
            SequenceRows(starts[i], starts[i + 1], x.cache,
                         {w: torch.where(m, zero, float("-inf")).repeat(groups, 1) for w, m in x.masks.items()},
                         x.order)
            for i, x in enumerate(inputs)
        ]
        capture = sorted({layer for x in inputs for layer in x.capture})
        hidden: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in capture:
                hidden[i] = h
            cos, sin = tables[self.arch.layer_types[i] if len(tables) > 1 else next(iter(tables))]
            h = layer.forward_batch(h, cos, sin, rows, positions)
        if len(self.layers) in capture:
            hidden[len(self.layers)] = h
        final = rms_norm(h, self.final_scale, self.arch.rms_norm_eps, self.arch.gemma_norm)
        # every sequence's logit rows through one LM head call
        picks = [_row_indices(x.logit_rows, starts[i], sizes[i]) for i, x in enumerate(inputs)]
        wanted = [p for p in picks if p is not None]
        logits = greedy = None
        if wanted:
            index = torch.cat(wanted).to(h.device)
            if not any(x.logits for x, p in zip(inputs, picks) if p is not None):
                greedy = self.greedy_tokens(final[index])  # None where no fused head applies
            if greedy is None:
                logits = self.logits(final[index])
                if any(x.argmax for x in inputs):  # every row at once: one kernel call instead of one per sequence
                    greedy = greedy_argmax(logits)
        outputs, offset = [], 0
        for i, x in enumerate(inputs):
            lo, hi = starts[i], starts[i + 1]
            seq_logits = seq_greedy = None
            if picks[i] is not None:
                n = picks[i].numel()
                seq_logits = None if logits is None else logits[offset : offset + n]
                if x.argmax and greedy is not None:
                    seq_greedy = greedy[offset : offset + n]
                offset += n
            outputs.append(DecoderOutput(
                logits=seq_logits,
                hidden={layer: hidden[layer][lo:hi] for layer in x.capture},
                final_hidden=final[lo:hi],
                argmax=seq_greedy,
            ))
        return outputs

    def prepare(self) -> Decoder:
        """Call once the weights are loaded (and after any change to them): caches derived tensors."""
        self.final_scale = norm_scale(self.final_norm, self.arch.gemma_norm)
        for layer in self.layers:
            layer.prepare()
        head = self.head_weight()
        if self.quantized_head is not None:
            self.packed_head = None
        elif self.packed_head is None or not self.packed_head.packs(head):  # loading prepares twice: pack once
            self.packed_head = PackedHead.build(head)
        if self.quantized_head is None and not self.arch.final_logit_softcap:
            # the greedy head's int8 copy (with AMX-INT8 greedy_argmax.head_screen's, else column_screen's), made
            # at load rather than in the first step
            if self.packed_head is not None or head_screen(head) is None:
                column_screen(head)
        self.__dict__["_truncated"] = {}  # clones hold derived tensors: made anew after a change
        return self

    def truncated(self, num_layers: int) -> Decoder:
        """The first `num_layers` layers with this model's final norm and LM head, sharing every weight.
        One clone per depth, so the self-drafts of many sequences share a batched forward (runtime.forward_batch
        batches the runtimes of one decoder)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"self-draft needs 1..{self.num_layers} layers, got {num_layers}")
        clones = self.__dict__.setdefault("_truncated", {})
        if num_layers not in clones:
            clones[num_layers] = self._clone_layers(num_layers)
        return clones[num_layers]

    def _clone_layers(self, num_layers: int) -> Decoder:
        clone = Decoder.__new__(Decoder)
        nn.Module.__init__(clone)
        clone.arch = self.arch
        clone.embed = self.embed
        clone.layers = nn.ModuleList(list(self.layers)[:num_layers])
        clone.final_norm = self.final_norm
        clone.lm_head = self.lm_head
        clone.quantized_head = self.quantized_head
        clone.packed_head = self.packed_head
        clone.rope = self.rope
        clone.final_scale = self.final_scale
        return clone
