"""glibc's mmap threshold is fixed for long model runs, unless the user set their own; freed heap pages go back."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

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


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_release_free_heap_returns_freed_blocks_below_the_mmap_threshold():
    cap_heap_growth()  # blocks under 1 MiB are then served from the heap, as tensors of a model run are
    blocks, keepers = [], []
    for _ in range(400):  # 200 MiB in 512 KiB blocks, each pinned in place by a small live block after it
        blocks.append(bytearray(512 * 1024))
        keepers.append(bytearray(2048))
    del blocks  # free, but held by the heap: the keepers stop glibc trimming its top
    before = _rss_mib()
    assert release_free_heap() is True
    after = _rss_mib()
    assert before - after > 100, (before, after)
    assert len(keepers) == 400 and all(len(k) == 2048 for k in keepers)  # live memory untouched


def test_release_free_heap_is_a_no_op_elsewhere(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert release_free_heap() is False
