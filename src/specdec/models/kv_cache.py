"""A preallocated key/value cache of fixed capacity, for one sequence.

Slots [0, length) hold committed tokens at positions 0..length-1. A forward writes its T new tokens into
slots [length, length + T) ("pending"); `commit` then keeps any subset of them (a chain prefix or the
accepted path of a tree), moving them down so the committed slots stay contiguous. Attention runs over
the whole buffer with a mask (the AVX2 kernel: over a span of it that holds what the row sees, see
attention_mask.attention_span): a key length that depends on nothing but the row is what makes a row's result
independent of how many queries share the forward, which is what makes speculative output identical to
plain decoding.

On CPUs whose kernels run attention on AMX tiles (amx_qk_scores.cpp, amx_probs_values.cpp), the cache stores
keys slot-major ([layers, kv_heads, capacity, head_dim]) and values dim-major ([layers, kv_heads, head_dim,
capacity]) instead, the layouts the tile multiplies read without repacking ("the tile layout"); `keys_t` and `values`
are then transposed views of them, so everything that reads or moves slots through those sees the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


_EMPTY = torch.empty(0)


def uses_tile_layout(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a cache of this shape stores the tile layout: bfloat16 on a CPU whose kernels run attention on
    tiles for this head dim."""
    if dtype != torch.bfloat16 or device.type != "cpu":
        return False
    from specdec.models import fast_linear

    k = fast_linear.kernel()
    return k is not None and hasattr(k, "amx_attention_ready") and bool(k.amx_attention_ready(head_dim))


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self._keys_store = torch.empty(0, dtype=dtype, device=device)
        self._values_store = torch.empty(0, dtype=dtype, device=device)
        self.tile_layout = uses_tile_layout(head_dim, dtype, device)
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        """Empties the cache and gives it `capacity` slots, in the memory it already holds where that is enough:
        allocating a new sequence's cache touched fresh pages, and at 32 admissions that took about 5% of a
        batched run (page faults), against a memset of memory already mapped."""
        shape_k = (self.num_layers, self.num_kv_heads, self.head_dim, capacity)
        shape_v = (self.num_layers, self.num_kv_heads, capacity, self.head_dim)
        need = self.num_layers * self.num_kv_heads * self.head_dim * capacity
        if self._keys_store.numel() < need:
            self._keys_store = self._keys_store.new_empty(need)
            self._values_store = self._values_store.new_empty(need)
        # Keys are stored transposed ([layers, kv_heads, head_dim, capacity]) so q @ k needs no copy.
        # Zeros, not whatever was there: masked slots are multiplied by exactly 0 in attention, and 0 * NaN
        # would leak.
        if self.tile_layout:  # the tiles' layouts (see the module's docstring), keys_t and values views of them
            self.keys_rows = self._keys_store[:need].view(shape_v).zero_()
            self.values_t = self._values_store[:need].view(shape_k).zero_()
            self.keys_t, self.values = self.keys_rows.transpose(2, 3), self.values_t.transpose(2, 3)
            self.layer_tile_buffers = list(zip(self.keys_rows.unbind(0), self.values_t.unbind(0)))
        else:
            self.keys_t = self._keys_store[:need].view(shape_k).zero_()
            self.values = self._values_store[:need].view(shape_v).zero_()
            self.layer_tile_buffers = [(_EMPTY, _EMPTY)] * self.num_layers
        # each layer's buffers as views made once: a batched decode step asks for them per sequence and layer
        self.layer_buffers = list(zip(self.keys_t.unbind(0), self.values.unbind(0)))
        # [capacity] position id held by each slot, -1 when empty; sliding windows are measured with it.
        self.positions = torch.full((capacity,), -1, dtype=torch.long, device=self.keys_t.device)
        self.capacity = capacity
        self.length = 0
        self.pending = 0

    @property
    def storage_bytes(self) -> int:
        """The memory the cache holds (at least what its capacity needs)."""
        return sum(t.numel() * t.element_size() for t in (self._keys_store, self._values_store))

    def reserve(self, num_tokens: int, positions: torch.Tensor) -> None:
        """Claims the next `num_tokens` slots for a forward; any earlier pending slots are dropped."""
        if self.length + num_tokens > self.capacity:
            raise ValueError(
                f"KV cache full: {self.length} committed + {num_tokens} new > capacity {self.capacity}"
            )
        self.pending = num_tokens
        self.positions[self.length : self.length + num_tokens] = positions

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores one layer's pending keys/values ([T, kv_heads, head_dim]); returns that layer's whole
        buffers: keys transposed [kv_heads, head_dim, capacity] and values [kv_heads, capacity, head_dim]."""
        start, end = self.length, self.length + self.pending
        self.keys_t[layer, :, :, start:end] = keys.permute(1, 2, 0)
        self.values[layer, :, start:end] = values.transpose(0, 1)
        return self.keys_t[layer], self.values[layer]

    def layer(self, layer: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's whole buffers (as `write` returns them) for a caller that writes the pending
        `num_tokens` keys/values itself at slots [length, length + num_tokens)."""
        if num_tokens != self.pending:
            raise ValueError(f"{num_tokens} rows for {self.pending} pending slots")
        return self.layer_buffers[layer]

    def tile_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's buffers in the tiles' layouts (keys [kv_heads, capacity, head_dim], values [kv_heads,
        head_dim, capacity]; `layer` returns views of them), or two empty tensors where the cache keeps the
        plain layouts."""
        return self.layer_tile_buffers[layer]

    def commit(self, kept: Sequence[int]) -> None:
        """Keeps the pending entries at indices `kept` (ascending, relative to the last forward)."""
        kept = list(kept)
        if any(not 0 <= i < self.pending for i in kept) or sorted(set(kept)) != kept:
            raise ValueError(f"kept indices {kept} must be ascending and within the {self.pending} pending slots")
        n = len(kept)
        if kept != list(range(n)):
            src = torch.tensor(kept, device=self.values.device) + self.length
            dst = slice(self.length, self.length + n)
            self.keys_t[..., dst] = self.keys_t.index_select(3, src)
            self.values[:, :, dst] = self.values.index_select(2, src)
            self.positions[dst] = self.positions.index_select(0, src)
        self.length += n
        self.pending = 0
        self.positions[self.length :] = -1

    def truncate(self, length: int) -> None:
        """Rolls the committed sequence back to its first `length` tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length
        self.pending = 0
        self.positions[length:] = -1
