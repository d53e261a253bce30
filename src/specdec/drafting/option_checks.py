"""The range checks every method's options share (each Options.problems() lists what is wrong, one line each)."""

from __future__ import annotations


def out_of_range(name: str, value: int, low: int, high: int) -> list[str]:
    """[] when low <= value <= high, else the line that says so."""
    return [] if low <= value <= high else [f"{name} must be in {low}..{high}, got {value}"]


def draft_shape_problems(num_speculative_tokens: int, tree_top_k: int | None, tree_num_draft_tokens: int,
                         max_length: int = 32, max_top_k: int = 32) -> list[str]:
    """A chain's length (a tree's depth), children per node (None: not a grown tree) and a tree's nodes; the
    nodes stay below 64 so that a tree with its root fits the verification forward's row budget."""
    return (out_of_range("num_speculative_tokens", num_speculative_tokens, 1, max_length)
            + ([] if tree_top_k is None else out_of_range("tree_top_k", tree_top_k, 1, max_top_k))
            + out_of_range("tree_num_draft_tokens", tree_num_draft_tokens, 1, 63))
