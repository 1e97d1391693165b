"""glibc's mmap threshold is fixed for long model runs, unless the user set their own; freed heap pages go back."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from rift_ada.memory import cap_heap_growth, release_free_heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_the_threshold_is_set_on_glibc_and_a_users_setting_wins(monkeypatch):
    ctypes.CDLL("libc.so.6")  # the machines this runs on are glibc Linux
    assert cap_heap_growth() is True
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert cap_heap_growth() is False


def test_other_platforms_are_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert cap_heap_growth() is False


_TRIM_SCENARIO = """
from pathlib import Path
from rift_ada.memory import cap_heap_growth, release_free_heap

def rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")

cap_heap_growth()  # blocks under the threshold are then served from the heap, as tensors of a model run are
blocks, keepers = [], []
for _ in range(400):  # 200 MiB in 512 KiB blocks, each pinned in place by a small live block after it
    blocks.append(bytearray(512 * 1024))
    keepers.append(bytearray(2048))
del blocks  # free, but held by the heap: the keepers stop glibc trimming its top
before = rss_mib()
ran = release_free_heap()
after = rss_mib()
assert len(keepers) == 400 and all(len(k) == 2048 for k in keepers)  # live memory untouched
print(ran, before, after)
"""


def _run_fresh(scenario: str) -> list[str]:
    """Run ``scenario`` in a fresh interpreter without the user's MALLOC_* settings; its printed words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", scenario], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_release_free_heap_returns_freed_blocks_below_the_mmap_threshold():
    # A fresh interpreter: a test worker's heap, shaped by the tests before it, would decide where
    # the blocks land (in CI a worker at 1 GiB of RSS served them elsewhere and the trim found 8 MiB).
    ran, before, after = _run_fresh(_TRIM_SCENARIO)
    assert ran == "True"
    assert float(before) - float(after) > 100, (before, after)


def test_release_free_heap_is_a_no_op_elsewhere(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert release_free_heap() is False


_THRESHOLD_SCENARIO = """
import ctypes
from rift_ada.memory import DEFAULT_MMAP_THRESHOLD, cap_heap_growth

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
assert cap_heap_growth()
mapped = libc.mallinfo2().hblks
below = [bytearray(6 << 20) for _ in range(4)]  # a batch-32 logits softmax's size: from the heap
after_below = libc.mallinfo2().hblks
above = bytearray(2 * DEFAULT_MMAP_THRESHOLD)  # past the threshold: its own mapping, returned on free
after_above = libc.mallinfo2().hblks
print(mapped, after_below, after_above)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_blocks_below_the_threshold_come_from_the_heap_and_larger_ones_are_mapped():
    mapped, after_below, after_above = map(int, _run_fresh(_THRESHOLD_SCENARIO))
    assert after_below == mapped  # 6 MiB tensors no longer each fault in a fresh mapping
    assert after_above == mapped + 1


_TOP_SCENARIO = """
import resource
from rift_ada.memory import cap_heap_growth

def touched():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

cap_heap_growth()
for round in range(2):  # 96 MiB in 12 MiB blocks (heap, under the mmap threshold) freed at the heap's top
    before = touched()
    blocks = [bytearray(12 << 20) for _ in range(8)]
    faults = touched() - before
    del blocks
print(faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_memory_freed_at_the_heaps_top_is_kept_for_the_next_blocks():
    """A long prefill frees tens of MiB at the heap's top layer after layer: the second round of the same blocks
    reuses the pages the first touched instead of faulting fresh ones in (at glibc's 32 MiB trim threshold, which
    gave them back, 18,400 of its 24,576 pages faulted)."""
    (faults,) = _run_fresh(_TOP_SCENARIO)
    assert int(faults) < (96 << 20) // 4096 // 10, faults
