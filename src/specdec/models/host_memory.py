"""Freed host memory kept for reuse (glibc malloc), so per-step tensors do not page-fault anew every step.

glibc serves an allocation above its mmap threshold with a fresh mapping and unmaps it on free. The
threshold adapts to freed sizes, but only up to 32 MiB, and the LM head's float32 logits pass that at 32
rows (262k vocabulary x 4 bytes = 1 MiB a row): from then on every step maps a new 32+ MiB output and
faults in each of its pages again. On the 2-core Zen 4 that was about 8,000 faults and 20 ms a call at 32
rows (the step-time jump from 28 to 32 rows), and a plain B=32 decode step took about 120 ms instead of
about 103. Raising the mmap and trim thresholds lets freed blocks up to MAX_REUSED_BYTES be served again
from the heap. Process-wide, like the allocators inference servers preload (vLLM's CPU build: tcmalloc);
SPECDEC_KEEP_FREED_MEMORY=0 leaves malloc as it was.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from functools import cache

logger = logging.getLogger(__name__)

MAX_REUSED_BYTES = 256 << 20  # allocations up to this size come from the heap and stay mapped once freed
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers


@cache
def keep_freed_memory() -> bool:
    """Sets glibc's mmap and trim thresholds to MAX_REUSED_BYTES once per process; False where it does not
    apply (another C library, or turned off)."""
    if os.environ.get("SPECDEC_KEEP_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MAX_REUSED_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, MAX_REUSED_BYTES))
    if not ok:
        logger.warning("mallopt refused the thresholds; large per-step tensors will page-fault every step")
    return ok
