"""glibc's mmap threshold is fixed for long model runs, unless the user set their own."""

from __future__ import annotations

import ctypes
import sys

import pytest

from rift_ada.memory import cap_heap_growth


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt exists on Linux only")
def test_the_threshold_is_set_on_glibc_and_a_users_setting_wins(monkeypatch):
    ctypes.CDLL("libc.so.6")  # the machines this runs on are glibc Linux
    assert cap_heap_growth() is True
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert cap_heap_growth() is False


def test_other_platforms_are_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert cap_heap_growth() is False
