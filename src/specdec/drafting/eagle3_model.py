"""The EAGLE-3 draft network: fused target features + token embedding -> one decoder layer -> draft vocab.

Layout and parameter names follow vLLM `speculators` (`fc`, `layers.0.{self_attn,mlp,hidden_norm,...}`,
`norm`, `d2t`, `t2d`) so the weights load there too. The target's embedding and LM head are used frozen
and are never stored here: `attach_target` gives the module views of them (the LM head rows of the draft
vocabulary), which is why the saved drafter stays small.

Two forwards share the layer: `train_unrolled` (training-time test, see `specdec.training.eagle3_trainer`)
and `step` (inference against an explicit KV cache with an arbitrary attention mask, for chains and trees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from specdec.drafting.draft_layers import GatedMLP, RMSNorm, StackedWeight, rope, rope_rows_tables
from specdec.drafting.int8_weights import Int8Copies, shape_problems
from specdec.drafting.vocab_map import SharedTargetParts
from specdec.models import fast_linear
from specdec.models.fast_linear import linear, module_linear as _lin


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] = field(default_factory=list)  # residual stream entering these target layers
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    # speculators' flag: the residual is the *normed* hidden state. Needed for targets whose residual
    # stream is large (Gemma's reaches RMS ~900), which would otherwise drown the layer's own output.
    norm_before_residual: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class Eagle3Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self._qkv = StackedWeight()
        self.int8: Int8Copies | None = None  # Eagle3Drafter.use_int8_weights: inference on int8 copies

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[n, 2H] -> q [heads, n, d], k and v [kv_heads, n, d], RoPE applied."""
        c, n = self.c, x.shape[0]
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        if torch.is_grad_enabled() or x.dim() != 2:
            q, k, v = _lin(self.q_proj, x), _lin(self.k_proj, x), _lin(self.v_proj, x)
        else:  # inference: one linear over [q; k; v] (each row's bits are its three products': row-invariant)
            stacked = self._qkv.of(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
            weight = stacked if self.int8 is None else self.int8.of("qkv", stacked)
            q, k, v = linear(x.to(self.q_proj.weight.dtype), weight).split([q_size, kv_size, kv_size], 1)
        q = q.reshape(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = k.reshape(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = v.reshape(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def out(self, attn: torch.Tensor) -> torch.Tensor:
        """[heads, n, d] -> [n, H]"""
        x = attn.transpose(0, 1).reshape(attn.shape[1], -1)
        if self.int8 is not None and not torch.is_grad_enabled():
            return linear(x.to(self.o_proj.weight.dtype), self.int8.of("o", self.o_proj.weight))
        return _lin(self.o_proj, x)


class Eagle3Layer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)


@dataclass
class ListedVisibility:
    """What each new row of a draft tree's level sees of the drafter's cache: entries 0 .. prefix - 1 (the
    context) and then `listed[row]`, ascending (its ancestors' entries and its own). The kernel reads the
    entries straight from these lists; a [rows, L] mask of them took a few tensor ops and a Python loop per
    row to build, and torch's masked attention over a 2k-entry cache about 0.65 ms a level."""

    prefix: int
    listed: list[list[int]]

    @property
    def rows(self) -> int:
        return len(self.listed)

    def slots(self) -> torch.Tensor:
        """int64 [rows, 1 + W]: the prefix, then the listed entries, -1 after each row's last (the kernel's form)."""
        width = max((len(x) for x in self.listed), default=0)
        return torch.tensor([[self.prefix, *entries] + [-1] * (width - len(entries)) for entries in self.listed],
                            dtype=torch.long).view(self.rows, 1 + width)

    def mask(self, length: int, device: torch.device) -> torch.Tensor:
        """bool [rows, length]: the same entries as a mask (torch's path)."""
        visible = torch.zeros(self.rows, length, dtype=torch.bool, device=device)
        visible[:, : self.prefix] = True
        for r, entries in enumerate(self.listed):
            visible[r, entries] = True
        return visible


Visibility = torch.Tensor | int | ListedVisibility  # a [rows, L] mask, n causal rows, or listed entries


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[0], dim=0) if x.shape[0] != heads else x


class Eagle3Drafter(SharedTargetParts):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.config = c
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(c)])
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self._init_draft_vocab(c.vocab_size, c.draft_vocab_size)
        self._fused: tuple[tuple, Any] | None = None  # _fused_arguments' key and arguments
        self.int8: Int8Copies | None = None  # use_int8_weights

    def int8_problems(self) -> list[str]:
        """Why use_int8_weights cannot apply to this drafter's shapes (none: it can)."""
        c = self.config
        return shape_problems([2 * c.hidden_size, c.num_attention_heads * c.head_dim, c.hidden_size,
                               c.intermediate_size])

    def use_int8_weights(self) -> Eagle3Drafter:
        """Inference from here on runs the layer's four linears and the draft-vocabulary head rows on int8
        copies (drafting/int8_weights.py); training still reads the bfloat16 weights. `fc` stays bfloat16: its
        input, the target's raw residual streams, has channels hundreds of times the others (Gemma's reach an
        RMS of ~900), which one int8 scale per row drowns (a tree's acceptance fell from 5.1 to 4.4 a step)."""
        problems = self.int8_problems()
        if problems:
            raise ValueError(problems[0])
        self.int8 = Int8Copies()
        self.layers[0].self_attn.int8 = self.int8
        self.layers[0].mlp.int8 = self.int8
        self._fused = None
        return self

    def head_weight_for_drafting(self) -> Any:
        """What the draft-vocabulary logits are computed with: the head rows, or their int8 copy."""
        assert self._head is not None
        return self._head if self.int8 is None else self.int8.of("head", self._head)

    # -- frozen target parts -------------------------------------------------------------------------
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[n, len(aux) * target_H] concatenated target features -> [n, H]."""
        return _lin(self.fc, features.to(self.fc.weight.dtype))

    # -- the layer -------------------------------------------------------------------------------------
    def _layer_input(self, h: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input [n, 2H], residual [n, H])"""
        layer = self.layers[0]
        e = self.embed(tokens).to(h.dtype)
        normed = layer.hidden_norm(h)
        residual = normed if self.config.norm_before_residual else h
        return torch.cat([layer.input_layernorm(e), normed], dim=-1), residual

    def _layer_output(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        layer = self.layers[0]
        h = residual + layer.self_attn.out(attn)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def step(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKVCache,
        visible: Visibility,
    ) -> torch.Tensor:
        """Inference: n new entries appended to `cache`; `visible` [n, cache_len_after] says which cache
        entries (including the new ones) each new entry attends to, or is n: causal (each new entry sees
        the cache before it and the new ones up to itself), or lists them (ListedVisibility). Returns the
        layer outputs [n, H]."""
        return self.step_batch(h, tokens, positions, [cache], [visible])

    def step_batch(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: list[DraftKVCache],
        visibles: Sequence[Visibility],
    ) -> torch.Tensor:
        """`step` for several sequences at once: their rows one after another (sequence i brings
        visibles[i].shape[0] rows, or visibles[i] causal ones, and its own cache). Projections and MLP run
        over all rows in one call each (row-invariant in bfloat16 on CPU, so every row has the bits of its
        sequence's `step` alone); attention runs per sequence over its own cache."""
        fused = self._fused_step(h, tokens, positions, caches, visibles)
        if fused is not None:
            return fused
        attn_mod = self.layers[0].self_attn
        x, residual = self._layer_input(h, tokens)
        q, k, v = attn_mod.qkv(x, positions)
        kernel = _draft_kernel(q) if all(isinstance(n, ListedVisibility) or (isinstance(n, int) and n <= KERNEL_ROWS)
                                         for n in visibles) else None
        if kernel is not None:
            return self._layer_output(residual, _kernel_attention(kernel, q, k, v, caches, visibles).to(h.dtype))  # type: ignore[arg-type]
        parts, start = [], 0
        for cache, visible in zip(caches, visibles):
            n = visible if isinstance(visible, int) else visible.rows if isinstance(visible, ListedVisibility) \
                else visible.shape[0]
            keys, values = cache.append(k[:, start : start + n], v[:, start : start + n])
            if isinstance(visible, ListedVisibility):
                visible = visible.mask(keys.shape[1], keys.device)
            parts.append(_cached_attention(q[:, start : start + n], keys, values,
                                           None if isinstance(visible, int) else visible))
            start += n
        if start != h.shape[0]:
            raise ValueError(f"{start} rows in the masks for {h.shape[0]} inputs")
        attn = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return self._layer_output(residual, attn.to(h.dtype))

    def _fused_step(self, h: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, caches: list[DraftKVCache],
                    visibles: Sequence[Visibility]) -> torch.Tensor | None:
        """step_batch's kernel path in one C++ call (kernels/avx2_draft_layer.cpp: the same kernels and ops in
        the same order, the same bits) where the kernels have it and every linear has its AMX-packed (or int8)
        copy or none (bfloat16 weights as they are); None elsewhere (the caller runs the Python path)."""
        kernel = _draft_kernel(h)
        if kernel is None or not hasattr(kernel, "draft_layer_call") or h.dim() != 2 or h.dtype != torch.bfloat16:
            return None
        if not all(isinstance(n, ListedVisibility) or (isinstance(n, int) and n <= KERNEL_ROWS) for n in visibles):
            return None
        arguments = self._fused_arguments()
        if arguments is None or h.shape[0] == 0:
            return None
        address, tiles, kinds, features, norms = arguments
        rows = [n.rows if isinstance(n, ListedVisibility) else n for n in visibles]  # type: ignore[union-attr]
        if sum(rows) != h.shape[0]:
            raise ValueError(f"{sum(rows)} rows for {h.shape[0]} inputs")
        c = self.config
        cos, sin = rope_rows_tables(c.rope_theta, c.head_dim, int(positions.max()) + 1, h.device, h.dtype)
        slots = [x.slots() if isinstance(x, ListedVisibility) else _NO_SLOTS for x in visibles]
        out = kernel.draft_layer_call(
            h, self.embed(tokens).to(h.dtype), address, tiles, kinds, features, norms, c.rms_norm_eps,
            c.norm_before_residual, [c.num_attention_heads, c.num_key_value_heads, c.head_dim], cos[positions],
            sin[positions], [x.k for x in caches], [x.v for x in caches], [x.length for x in caches], rows,
            1.0 / math.sqrt(c.head_dim), slots if any(x.numel() for x in slots) else [])
        for cache, n in zip(caches, rows):
            cache.length += n
        return out

    def _fused_arguments(self) -> tuple[int, list[torch.Tensor], list[int], list[int], list[torch.Tensor]] | None:
        """draft_layer_call's weights (the linears' function address, the four linears' tiles and kinds, their
        output features, the three norms' float32 scales), gathered once per change of any weight: with
        use_int8_weights their int8 copies, else the bfloat16 weights through fast_linear.layer_linear_arguments
        (their packed copies, or as they are where none is packed); None otherwise."""
        layer = self.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        raw = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight, mlp.gate_proj.weight,
               mlp.up_proj.weight, mlp.down_proj.weight, layer.hidden_norm.weight, layer.input_layernorm.weight,
               layer.post_attention_layernorm.weight)
        key = (self.int8 is not None, *((w.data_ptr(), w._version, w.dtype) for w in raw))
        if self._fused is None or self._fused[0] != key:
            weights = [attn._qkv.of(*raw[:3]), raw[3], mlp._gate_up.of(*raw[4:6]), raw[6]]
            features = [int(w.shape[0]) for w in weights]
            arguments = None
            if self.int8 is not None:
                int8 = [self.int8.of(name, w) for name, w in zip(("qkv", "o", "gate_up", "down"), weights)]
                args = [q.kernel_args() for q in int8]
                if len({a[2] for a in args}) == 1 and args[0][2] != 0:
                    arguments = (args[0][2], [t for a in args for t in a[0]], [a[1] for a in args], features)
            else:
                layer_linear = fast_linear.layer_linear_arguments(weights)
                if layer_linear is not None:
                    arguments = (*layer_linear, features, features)
            if arguments is not None:
                norms = [layer.hidden_norm.scale(), layer.input_layernorm.scale(), layer.post_attention_layernorm.scale()]
                arguments = (*arguments, norms)
            self._fused = (key, arguments)
        return self._fused[1]

    def train_unrolled(
        self, h: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
        past_k: list[torch.Tensor], past_v: list[torch.Tensor], window: int | None = None, offset: int = 0,
    ) -> torch.Tensor:
        """Training-time test step j = len(past_k): query t attends to step-0 keys 0..t (causal) and to
        its own entries of steps 1..j-1 plus this step's (the diagonal), as drafting on its own outputs
        does at inference. Keys of this step are appended to past_k/past_v. h, tokens: [n, ...].
        `offset`: only indices offset.. are needed as outputs (the rows a long prompt's scored response
        needs). Step 0 takes every index, as its keys and values are every later query's context, but runs
        its queries, and returns its outputs, from `offset` on only: the attention over a long prompt then
        costs [n - offset, n] rather than [n, n]. Later steps take (and return) indices offset.. only.
        `window`: step-0 keys more than `window` positions back are hidden (the drafter's attention window)."""
        attn_mod = self.layers[0].self_attn
        x, residual = self._layer_input(h, tokens)
        q, k, v = attn_mod.qkv(x, positions)
        past_k.append(k)
        past_v.append(v)
        if len(past_k) == 1 and offset:
            q, residual = q[:, offset:], residual[offset:]
        n, heads, scale = q.shape[1], q.shape[0], 1.0 / math.sqrt(q.shape[-1])
        k0, v0 = _expand_kv(past_k[0][:, : offset + n], heads), _expand_kv(past_v[0][:, : offset + n], heads)
        scores = [torch.matmul(q, k0.transpose(-1, -2)) * scale]  # [heads, n, offset + n]
        causal = torch.ones(n, offset + n, dtype=torch.bool, device=q.device).tril(offset)
        if window is not None:
            causal = causal.triu(offset - (window - 1))
        scores[0] = scores[0].masked_fill(~causal, float("-inf"))
        diag = [(q * _expand_kv(ki[:, :n], heads)).sum(-1, keepdim=True) * scale for ki in past_k[1:]]
        weights = torch.softmax(torch.cat(scores + diag, dim=-1).float(), dim=-1).to(q.dtype)
        attn = torch.matmul(weights[..., : offset + n], v0)
        for i, vi in enumerate(past_v[1:]):
            attn = attn + weights[..., offset + n + i : offset + n + i + 1] * _expand_kv(vi[:, :n], heads)
        return self._layer_output(residual, attn)


_NO_SLOTS = torch.empty(0, dtype=torch.long)  # a causal sequence's entry in draft_attention's slots
KERNEL_ROWS = 16  # new rows per sequence up to which causal steps run in one kernel call (beyond: torch's matmuls)


def _draft_kernel(q: torch.Tensor) -> Any | None:
    if q.device.type != "cpu" or torch.is_grad_enabled():
        return None
    k = fast_linear.kernel()
    return k if k is not None and hasattr(k, "draft_attention") else None


def _kernel_attention(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, caches: Sequence[DraftKVCache],
                      visibles: Sequence[int | ListedVisibility]) -> torch.Tensor:
    """Attention of every sequence's new rows over its own cache in one kernel call (causal, or a tree
    level's listed entries; kernels/avx2_draft_attention.cpp): [heads, sum rows, d] float32. At 32 sequences
    drafting one row each, the per-sequence torch ops cost more than the arithmetic."""
    keys, values, rows, start = [], [], [], 0
    for cache, visible in zip(caches, visibles):
        n = visible.rows if isinstance(visible, ListedVisibility) else visible
        cache_k, cache_v = cache.append(k[:, start : start + n], v[:, start : start + n])
        keys.append(cache_k)
        values.append(cache_v)
        rows.append(n)
        start += n
    if start != q.shape[1]:
        raise ValueError(f"{start} rows for {q.shape[1]} inputs")
    qf = q.to(torch.float32).contiguous()
    empty = torch.empty(0, dtype=torch.long)
    slots = [x.slots() if isinstance(x, ListedVisibility) else empty for x in visibles]
    if all(x.numel() == 0 for x in slots):
        slots = []
    return kernel.draft_attention(qf, keys, values, rows, 1.0 / math.sqrt(q.shape[-1]), slots)


def _cached_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      visible: torch.Tensor | None) -> torch.Tensor:
    """q [heads, n, d] over one sequence's cached keys/values [kv_heads, L, d] -> [heads, n, d] (float32).
    `visible` [n, L]: what each row attends to; None: causal (the n rows are the cache's last n entries).

    float32 (a bfloat16 cache widened first): a few query rows over a short cache, where CPU bf16 batched
    matmuls are slow. The query heads sharing a KV head are stacked as rows, so the shared keys are read in
    place rather than repeated per head (3x faster than sdpa's math path here). A causal step masks only
    its own last n columns: a drafted token's step, one row per sequence, then masks nothing, and a
    sequence's step costs a few tensor ops fewer (32 sequences run one after another here)."""
    if keys.dtype == torch.bfloat16:  # draft_cache_dtype's: the same values in float32
        keys, values = keys.float(), values.float()
    kv_heads, (heads, n, dim) = keys.shape[0], q.shape
    groups = heads // kv_heads
    qf = q.to(keys.dtype).reshape(kv_heads, groups * n, dim)
    scores = torch.matmul(qf, keys.transpose(1, 2)).mul_(1.0 / math.sqrt(dim))
    if visible is not None:
        scores.masked_fill_(~visible.repeat(groups, 1), float("-inf"))
    elif n > 1:
        later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1).repeat(groups, 1)
        scores[..., -n:].masked_fill_(later, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), values).view(heads, n, dim)


def draft_cache_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype an inference DraftKVCache keeps for a drafter with this weight: bfloat16 where the drafter runs
    in bfloat16 with the kernels (its keys and values are bfloat16 products, so bfloat16 holds them exactly, and
    the kernel widens them to the float32 its attention runs in: the same sums at half the bytes, a tenth off a
    tree level over a 2,500-token prompt), else float32, the dtype torch's attention path runs in."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return torch.float32
    k = fast_linear.kernel()
    return torch.bfloat16 if k is not None and hasattr(k, "draft_attention") else torch.float32


class DraftKVCache:
    """The drafter's own keys/values [kv_heads, capacity, d]; `length` entries are valid. Inference keeps
    them in float32 or bfloat16 (draft_cache_dtype); the attention runs in float32 on the same values either
    way."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device):
        self.k = torch.zeros(kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[1]
        if self.length + n > self.k.shape[1]:
            raise RuntimeError(f"draft KV cache full ({self.k.shape[1]} entries)")
        self.k[:, self.length : self.length + n] = k
        self.v[:, self.length : self.length + n] = v
        self.length += n
        return self.k[:, : self.length], self.v[:, : self.length]

    def truncate(self, length: int) -> None:
        self.length = length
