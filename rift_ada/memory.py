"""Keep glibc's heap from ballooning under PyTorch's CPU tensors.

glibc serves a freed large block's size from the heap from then on (its mmap threshold grows
dynamically up to 32 MiB), and the heap of a long probe or closed loop, full of tensors of
ever-changing sizes, then fragments without returning memory to the system: a 400-token probe of
SmolLM2-135M with 7 arms reached 15.1 GB of RSS. A fixed 1 MiB threshold serves every larger
block by mmap, returned on free: 1.9 GB, and 10–33 % faster (docs/performance.md, "Memory").
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["DEFAULT_MMAP_THRESHOLD", "cap_heap_growth"]

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
DEFAULT_MMAP_THRESHOLD = 1 << 20


def cap_heap_growth(threshold: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; True when set.

    No-op (False) off glibc Linux, and when the user set ``MALLOC_MMAP_THRESHOLD_`` (theirs wins).
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))
