"""The model runtime the engine and the drafters talk to: forward new tokens, then commit what was kept.

One runtime holds one sequence. `forward` appends T tokens after the committed ones, as a chain or as a draft
tree (`parents`), and can return the logits of chosen rows and the hidden states of chosen layers;
`commit(kept)` keeps any subset of those T tokens (a prefix, or the accepted path of a tree) and drops
the rest; `truncate` rolls committed tokens back.
`forward_batch(runtimes, calls)` runs several sequences' forwards in one pass over the weights where the
runtimes share a native decoder; each result is bit-identical to that runtime's `forward` alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.models.attention_mask import build_mask, chain_parents, reorder_mask, tree_ancestry, tree_slot_order
from specdec.models import fast_linear
from specdec.models.decoder import Decoder, DecoderInput
from specdec.models.kv_cache import KVCache

# A finished sequence's KV cache up to this size stays with its runtime for the next sequence: 32 of them
# are 1 GiB at most, and 32 MiB hold about 1,800 tokens of the default model.
KEEP_CACHE_BYTES = 32 << 20

LogitRows = str | Sequence[int] | None  # "all", "last", explicit row indices, or None for no logits


@dataclass
class ForwardResult:
    logits: torch.Tensor | None  # [R, vocab] float32 for the requested rows
    hidden: dict[int, torch.Tensor]  # residual stream entering layer i, [T, hidden]; i == num_layers: final layer output
    final_hidden: torch.Tensor | None  # [T, hidden] after the final norm (what the LM head sees)
    argmax: torch.Tensor | None = None  # [R] greedy token of each logit row, where the call asked for it


@dataclass
class ForwardCall:
    """The arguments of one `ModelRuntime.forward`, for a batch of them."""

    tokens: Sequence[int]
    parents: Sequence[int] | None = None
    capture: Sequence[int] = ()
    logit_rows: LogitRows = "all"
    argmax: bool = False  # also each logit row's greedy token, the whole batch's in one call (ForwardResult.argmax)
    # False: the greedy tokens are all the caller reads, so a runtime may leave ForwardResult.logits None
    # (the native one then runs the LM head fused with the argmax, without writing the logits)
    logits: bool = True

    def __post_init__(self) -> None:
        if not self.logits and not self.argmax:
            raise ValueError("a forward without logits must ask for their argmax")


class ModelRuntime(ABC):
    exact: bool  # whether a row's result is independent of how many tokens share its forward
    vocab_size: int
    num_layers: int
    device: torch.device

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of committed tokens."""

    @abstractmethod
    def reset(self, capacity: int) -> None:
        """Starts a new sequence that may hold up to `capacity` tokens (committed plus one forward's worth)."""

    @abstractmethod
    def forward(
        self,
        tokens: Sequence[int],
        parents: Sequence[int] | None = None,
        capture: Sequence[int] = (),
        logit_rows: LogitRows = "all",
    ) -> ForwardResult:
        """Runs `tokens` after the committed sequence. `parents[i]` is the index of token i's parent in this
        call, or -1 when it follows the committed sequence directly; None means a chain."""

    @abstractmethod
    def commit(self, kept: Sequence[int]) -> None:
        """Keeps the tokens of the last forward at indices `kept` (ascending, a root-to-node path)."""

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Drops committed tokens beyond the first `length`."""

    def release(self) -> None:
        """Ends the sequence: its KV cache is freed, or, up to KEEP_CACHE_BYTES, kept for the next `reset` to
        reuse (fresh pages cost page faults)."""

    @property
    def scores_head_slices(self) -> bool:
        """Whether `head_logits` scores any vocabulary columns with exactly the numbers the whole head gives
        (what verification/greedy_early_exit.py needs)."""
        return False

    def head_logits(self, hidden: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
        """float32 logits [n, c] of final-normed states `hidden` [n, H] over the vocabulary `columns` (a
        slice, or token ids [c])."""
        raise NotImplementedError(f"{type(self).__name__} does not score vocabulary slices")

    def head_max(self, hidden: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(values [n] float32, indices [n] int64 within `columns`): greedy_argmax of head_logits(hidden,
        columns) per row and the logit there, where found without the logits; else None."""
        return None

    def prefill(self, tokens: Sequence[int], capture: Sequence[int] = ()) -> ForwardResult:
        """Forwards and commits a whole chunk; returns the last row's logits."""
        result = self.forward(tokens, capture=capture, logit_rows="last")
        self.commit(range(len(tokens)))
        return result


def _rows(rows: LogitRows, t: int) -> torch.Tensor | slice | None:
    if rows is None:
        return None
    if rows == "all":
        return slice(None)
    if rows == "last":
        return slice(t - 1, t)
    return torch.tensor(list(rows), dtype=torch.long)


class NativeRuntime(ModelRuntime):
    """Runs our Decoder over a preallocated, fixed-capacity KVCache.

    Exact across query counts in bfloat16 on CPU (see fast_linear.py); float32 matmuls on CPU and GPU
    kernels round differently for different row counts, so there `exact` is False.
    """

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.vocab_size = decoder.arch.vocab_size
        self.num_layers = decoder.num_layers
        self.device = decoder.device
        self.exact = decoder.dtype == torch.bfloat16 and self.device.type == "cpu"
        self.windows = sorted({layer.window for layer in decoder.layers}, key=lambda w: (w is not None, w or 0))
        self.cache: KVCache | None = None

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    def reset(self, capacity: int) -> None:
        if self.cache is None:
            a = self.decoder.arch
            self.cache = KVCache(self.num_layers, a.num_kv_heads, a.head_dim, capacity, self.decoder.dtype, self.device)
        elif self.cache.capacity != capacity:
            self.cache.resize(capacity)
        else:
            self.cache.truncate(0)

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("call reset(capacity) before running the model")
        return self.cache

    def decoder_input(self, call: ForwardCall) -> DecoderInput:
        """Reserves the call's slots in this runtime's cache and builds its positions, masks and tree order."""
        cache = self._require_cache()
        tokens, parents = call.tokens, call.parents
        t = len(tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        if parents is None:
            ancestry = torch.ones(t, t, dtype=torch.bool, device=self.device).tril_()
            depth = torch.arange(t, device=self.device)
        else:
            if len(parents) != t:
                raise ValueError(f"{len(parents)} parents for {t} tokens")
            ancestry, depth = tree_ancestry(parents, self.device)
        positions = cache.length + depth
        cache.reserve(t, positions)
        chain = parents is None or list(parents) == chain_parents(t)
        masks: dict[int | None, torch.Tensor] = {}
        if not (chain and self._kernel_chain_masks()):  # the attention kernel builds a chain's mask itself
            masks = {w: build_mask(cache.positions, cache.length, ancestry, positions, w) for w in self.windows}
        order = None
        if not chain:
            # a real tree: every token reads its ancestors in chain order (bit-identical to plain decoding)
            order = tree_slot_order(ancestry, cache.length, cache.capacity)
            masks = {w: reorder_mask(m, order, depth, cache.length) for w, m in masks.items()}
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)
        return DecoderInput(ids, positions, masks, cache, call.capture, _rows(call.logit_rows, t), order,
                            call.argmax, call.logits)

    def _kernel_chain_masks(self) -> bool:
        """Whether this runtime's attention runs in the kernel's attention_batch, which builds a chain's
        mask from its slots and the layer's window when given none (decoder.DecoderLayer.forward_batch)."""
        return self.exact and hasattr(fast_linear.kernel(), "attention_batch")

    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        parents: Sequence[int] | None = None,
        capture: Sequence[int] = (),
        logit_rows: LogitRows = "all",
    ) -> ForwardResult:
        return forward_batch([self], [ForwardCall(tokens, parents, capture, logit_rows)])[0]

    @property
    def scores_head_slices(self) -> bool:
        # our bfloat16 row kernel computes every logit as its own fixed-order dot product, whatever the
        # slice; torch's GEMMs may block differently by shape, so elsewhere the whole head is scored. Where the
        # greedy head is screened by its int8 copy, every row's argmax at once costs less than one row's logits.
        return self.exact and fast_linear.kernel() is not None and not self.decoder.screens_head

    def head_logits(self, hidden: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
        return self.decoder.logits(hidden, columns)

    def head_max(self, hidden: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.decoder.head_max(hidden, columns)

    def commit(self, kept: Sequence[int]) -> None:
        self._require_cache().commit(kept)

    def truncate(self, length: int) -> None:
        self._require_cache().truncate(length)

    def release(self) -> None:
        # a small cache stays for the next sequence's `reset` (KVCache.resize), a large one is freed
        if self.cache is not None and self.cache.storage_bytes > KEEP_CACHE_BYTES:
            self.cache = None


@torch.inference_mode()
def forward_batch(runtimes: Sequence[ModelRuntime], calls: Sequence[ForwardCall]) -> list[ForwardResult]:
    """`runtimes[i].forward(calls[i])` for every i: one pass over the weights for the native runtimes that
    share a decoder (bit-identical to each alone), one call each for any other runtime."""
    if len(runtimes) != len(calls):
        raise ValueError(f"{len(calls)} calls for {len(runtimes)} runtimes")
    if len({id(r) for r in runtimes}) != len(runtimes):
        raise ValueError("a runtime appears twice in one batch")
    results: list[ForwardResult | None] = [None] * len(runtimes)
    groups: dict[int, list[int]] = {}
    for i, runtime in enumerate(runtimes):
        if isinstance(runtime, NativeRuntime):
            groups.setdefault(id(runtime.decoder), []).append(i)
        else:
            c = calls[i]
            results[i] = runtime.forward(c.tokens, c.parents, c.capture, c.logit_rows)
    for members in groups.values():
        inputs = [runtimes[i].decoder_input(calls[i]) for i in members]  # type: ignore[attr-defined]
        outs = runtimes[members[0]].decoder.forward_batch(inputs)  # type: ignore[attr-defined]
        for i, out in zip(members, outs):
            results[i] = ForwardResult(logits=out.logits, hidden=out.hidden, final_hidden=out.final_hidden,
                                       argmax=out.argmax)
    return [r for r in results if r is not None]
