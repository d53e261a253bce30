"""The DFlash block-diffusion draft network (arXiv 2602.06036): one forward drafts a whole block.

Target features (outputs of a few target layers, concatenated) go through `fc` and `hidden_norm` to give
one context vector per committed position. Every draft layer projects those context vectors with its own
k/v projections and attends from the block's queries to [context keys | block keys]: the queries come from
the block only, and the block attends to itself without a causal mask. A block is
[anchor, MASK x (B-1)] at positions anchor_pos .. anchor_pos + B - 1; slot i predicts the token at
anchor_pos + i. The target's embedding and LM head are shared, frozen, and never stored (`attach_target`).

Parameter names follow vLLM `speculators` (`fc`, `hidden_norm`, `layers.N.self_attn.{q,k,v,o}_proj`,
`q_norm`, `k_norm`, `input_layernorm`, `post_attention_layernorm`, `mlp`, `norm`, `d2t`, `t2d`).

One code path serves training and inference: `blocks` runs A blocks at once, block a seeing the context
positions `visible[a]` (training: positions before its anchor, the block-sparse mask) or every cached
context position (inference: the context cache holds committed positions only). `blocks_batch` runs the
blocks of several sequences at once, each over its own context cache (batched drafting, dflash_batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from specdec.drafting.draft_layers import GatedMLP, RMSNorm, rope
from specdec.drafting.vocab_map import SharedTargetParts
from specdec.models.fast_linear import module_linear as _lin

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values of one layer: [kv_heads, n, head_dim] each


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    block_size: int
    mask_token_id: int
    # DFlash convention: the OUTPUTS of these target layers, i.e. our runtime's hidden[id + 1] (hidden[i] is
    # the residual stream entering layer i). EAGLE-3's aux ids and speculators/vLLM's DFlash ids are runtime
    # indices (dflash_format.py converts); never mix the two.
    aux_layer_ids: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768

    @property
    def runtime_layers(self) -> tuple[int, ...]:
        """The runtime hidden-state indices holding the aux layers' outputs."""
        return tuple(i + 1 for i in self.aux_layer_ids)

    def to_dict(self) -> dict:
        return asdict(self)


def attend(q: torch.Tensor, ctx: KV, blk: KV, visible: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Block attention. q [heads, A, B, d]; ctx keys/values [kv_heads, N, d]; blk keys/values
    [kv_heads, A, B, d]; visible [A, N] bool (None: all). Block a's queries see the context positions
    visible[a] and all B positions of block a, nothing of other blocks. Returns [heads, A, B, d].

    Scores against the context and against the own block are computed apart and share one softmax, so the
    block-diagonal part never materialises an [A*B, A*B] matrix. Query heads sharing a KV head are grouped
    (no copy of the keys)."""
    heads, a, b, d = q.shape
    kv_heads, n = ctx[0].shape[0], ctx[0].shape[1]
    qg = q.reshape(kv_heads, heads // kv_heads, a, b, d)
    s_ctx = torch.einsum("kgabd,knd->kgabn", qg, ctx[0]) * scale
    if visible is not None:
        s_ctx = s_ctx.masked_fill(~visible[:, None, :], float("-inf"))
    s_blk = torch.einsum("kgabd,kacd->kgabc", qg, blk[0]) * scale
    w = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1).float(), dim=-1).to(ctx[1].dtype)
    out = torch.einsum("kgabn,knd->kgabd", w[..., :n], ctx[1]) + torch.einsum("kgabc,kacd->kgabd", w[..., n:], blk[1])
    return out.reshape(heads, a, b, d)


def context_visibility(anchors: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Training: the block of an anchor at position p sees the context positions < p ([A, seq_len] bool),
    exactly what the inference cache holds when that anchor is the pending token."""
    return torch.arange(seq_len, device=anchors.device)[None, :] < anchors[:, None]


def training_attention_mask(anchors: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """The dense form of the training mask, [A*B, seq_len + A*B] over keys [context | all blocks]
    (speculators' anchor-block mask). `attend` implements it without building it; tests compare both."""
    a = anchors.numel()
    ctx = context_visibility(anchors, seq_len).repeat_interleave(block_size, dim=0)
    block_of = torch.arange(a * block_size, device=anchors.device) // block_size
    return torch.cat([ctx, block_of[:, None] == block_of[None, :]], dim=1)


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> KV:
        """x [..., H] at positions [...] -> keys, values [kv_heads, ..., d] (RoPE on the keys)."""
        c = self.c
        k = self.k_norm(_lin(self.k_proj, x).unflatten(-1, (c.num_key_value_heads, c.head_dim))).movedim(-2, 0)
        v = _lin(self.v_proj, x).unflatten(-1, (c.num_key_value_heads, c.head_dim)).movedim(-2, 0)
        return rope(k, positions, c.rope_theta), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctxs: Sequence[KV],
                visible: torch.Tensor | None) -> torch.Tensor:
        """x [A, B, H] (normed block states) at positions [A, B] -> attention output [A, B, H]. ctxs: one
        context for every block (training: `visible` picks each block's positions), or one per block
        (blocks of several sequences, each over its own cache; visible None)."""
        c = self.c
        q = self.q_norm(_lin(self.q_proj, x).unflatten(-1, (c.num_attention_heads, c.head_dim))).movedim(-2, 0)
        q = rope(q, positions, c.rope_theta)
        blk = self.kv(x, positions)
        if len(ctxs) == 1:
            out = self._attend(q, ctxs[0], blk, visible)
        else:
            if len(ctxs) != x.shape[0] or visible is not None:
                raise ValueError(f"{len(ctxs)} contexts for {x.shape[0]} blocks (one, or one per block, no mask)")
            # block by block: each has the shapes, so the bits, of its sequence's block alone
            out = torch.cat([self._attend(q[:, a : a + 1], ctx, (blk[0][:, a : a + 1], blk[1][:, a : a + 1]), None)
                             for a, ctx in enumerate(ctxs)], dim=1)
        return _lin(self.o_proj, out.movedim(0, -2).flatten(-2))

    def _attend(self, q: torch.Tensor, ctx: KV, blk: KV, visible: torch.Tensor | None) -> torch.Tensor:
        dtype = q.dtype
        if not torch.is_grad_enabled():
            # inference: float32, CPU bf16 batched matmuls are slow at these sizes; contiguous, so a block
            # sliced out of a batch meets the matmuls in the layout it has alone
            q, ctx, blk = _f32(q), (_f32(ctx[0]), _f32(ctx[1])), (_f32(blk[0]), _f32(blk[1]))
        return attend(q, ctx, blk, visible, self.c.head_dim**-0.5).to(dtype)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous()


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = DFlashAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, ctxs: Sequence[KV],
                visible: torch.Tensor | None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions, ctxs, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(SharedTargetParts):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        if not 0 <= c.mask_token_id < c.vocab_size:
            raise ValueError(f"mask_token_id {c.mask_token_id} is outside the target's vocabulary of {c.vocab_size}")
        if c.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {c.block_size}")
        self.config = c
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self._init_draft_vocab(c.vocab_size, c.draft_vocab_size)

    # -- frozen target parts and the draft vocabulary (as in EAGLE-3) -------------------------------------
    # -- the network --------------------------------------------------------------------------------------
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """[n, len(aux) * target_H] concatenated target layer outputs -> context vectors [n, H]."""
        return self.hidden_norm(_lin(self.fc, features.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Every layer's keys/values of context vectors [n, H] at positions [n]: what the cache stores."""
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def block_tokens(self, anchors: torch.Tensor) -> torch.Tensor:
        """[A] anchor token ids -> [A, B] blocks [anchor, MASK, ..., MASK]."""
        c = self.config
        blocks = torch.full((anchors.numel(), c.block_size), c.mask_token_id, dtype=torch.long, device=anchors.device)
        blocks[:, 0] = anchors
        return blocks

    def blocks(self, tokens: torch.Tensor, positions: torch.Tensor, ctx: list[KV],
               visible: torch.Tensor | None) -> torch.Tensor:
        """tokens, positions [A, B]; ctx: per layer context keys/values over N positions; visible [A, N] or
        None (all). Returns the last layer's states [A, B, H] (before the final norm)."""
        return self.blocks_batch(tokens, positions, [ctx], visible)

    def blocks_batch(self, tokens: torch.Tensor, positions: torch.Tensor, ctxs: Sequence[list[KV]],
                     visible: torch.Tensor | None = None) -> torch.Tensor:
        """`blocks` with one context for all A blocks (`[ctx]`), or one per block (A sequences, each block
        over its own context cache, visible None): the linears run over every block's rows in one call
        each (row-invariant in bfloat16 on CPU), the attention block by block."""
        if any(len(ctx) != len(self.layers) for ctx in ctxs):
            raise ValueError(f"a context needs keys/values for each of the {len(self.layers)} layers")
        h = self.embed(tokens).to(self.fc.weight.dtype)
        for i, layer in enumerate(self.layers):
            h = layer(h, positions, [ctx[i] for ctx in ctxs], visible)
        return h


class ContextCache:
    """Per draft layer, the context keys/values of committed positions 0..length-1 ([layers, kv, cap, d]).
    Block keys never enter it, so nothing is rolled back after verification."""

    def __init__(self, c: DFlashConfig, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (c.num_hidden_layers, c.num_key_value_heads, capacity, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, kvs: list[KV]) -> None:
        n = kvs[0][0].shape[1]
        if self.length + n > self.k.shape[2]:
            raise RuntimeError(f"DFlash context cache full ({self.k.shape[2]} positions)")
        for i, (k, v) in enumerate(kvs):
            self.k[i, :, self.length : self.length + n] = k
            self.v[i, :, self.length : self.length + n] = v
        self.length += n

    def views(self) -> list[KV]:
        return [(self.k[i, :, : self.length], self.v[i, :, : self.length]) for i in range(self.k.shape[0])]
