"""Freed host memory kept for reuse: glibc's thresholds set once, and an opt-out."""

from __future__ import annotations

import platform

import pytest

from specdec.models.host_memory import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_thresholds_are_set_on_glibc():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # once per process, then cached


def test_opt_out_leaves_malloc_alone(monkeypatch):
    monkeypatch.setenv("SPECDEC_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory.__wrapped__() is False
