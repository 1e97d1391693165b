"""Keep glibc's heap from ballooning under PyTorch's CPU tensors, without an mmap per mid-sized tensor.

glibc serves a freed large block's size from the heap from then on (its mmap threshold grows
dynamically up to 32 MiB), and the heap of a long probe or closed loop, full of tensors of
ever-changing sizes, then fragments without returning memory to the system: a 400-token probe of
SmolLM2-135M with 7 arms reached 15.1 GB of RSS. A fixed threshold stops that growth (1.9 GB at 1 MiB,
1.83 GB at 16 MiB). It is fixed at 16 MiB, not lower, because every block above it is a fresh mmap whose pages
fault in on first touch: at 1 MiB a 3 MiB bf16 -> float32 key upcast took 1.71 ms against 0.17 ms at
16 MiB, and a 6 MiB softmax 4.95 ms against 1.45 ms (docs/performance.md, "Memory", with its command).
The trim threshold (how much free memory at the heap's top glibc keeps instead of handing it back to the
kernel) is 256 MiB, not glibc's twice-the-mmap-threshold: a long prefill's activations (tens of MiB, each block
under 16 MiB) are freed at the top layer after layer, and at 32 MiB the heap gave them back and faulted them in
again; a probe of 4 requests of 2K-token prompts then faulted 748 K fresh pages in its set-up, against 282 K at
256 MiB (1.33 against 0.50 CPU-s of system time; docs/notes/2026-12-07-probe-zen4-first-touch.md, section 5).

Blocks under the threshold stay in the heap once freed: after a 32-request closed loop the process
kept 2.98 GiB, of which ``malloc_trim`` gave 2.06 GiB back in 0.17 s (docs/performance.md, "Memory").
:func:`release_free_heap` does that between stages, so one stage's peak does not stay charged to the
machine through the next.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["DEFAULT_MMAP_THRESHOLD", "DEFAULT_TRIM_THRESHOLD", "cap_heap_growth", "release_free_heap"]

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 16 << 20
DEFAULT_TRIM_THRESHOLD = 256 << 20


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def cap_heap_growth(threshold: int = DEFAULT_MMAP_THRESHOLD, trim: int = DEFAULT_TRIM_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes and its trim threshold at ``trim`` (at least twice the
    mmap threshold, as glibc's own setting); True when set. No-op (False) off glibc Linux, and when the user set
    ``MALLOC_MMAP_THRESHOLD_`` (theirs wins).
    """
    libc = None if "MALLOC_MMAP_THRESHOLD_" in os.environ else _glibc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    trim = max(int(trim), 2 * int(threshold))
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold))) and bool(mallopt(M_TRIM_THRESHOLD, trim))


def release_free_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim(0)``); True when it ran.

    Live memory is untouched; only freed blocks' whole pages go. No-op (False) off glibc Linux.
    """
    trim = getattr(_glibc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
