"""The staleness section's paired findings (benchmarks/staleness_models.py), on synthetic runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "staleness_models.py"


@pytest.fixture(scope="module")
def staleness():
    spec = importlib.util.spec_from_file_location("staleness_models", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["staleness_models"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("staleness_models", None)


def _cell(swa: list[list[float]], snapkv: list[list[float]], looping: list[bool]) -> dict:
    """Requests of 40 output tokens; each policy's rounds hold one AL per quarter (positions 0, 10, 20, 30)."""
    runs = []
    for request, (swa_quarters, snap_quarters) in enumerate(zip(swa, snapkv, strict=True)):
        for policy, quarters in (("swa", swa_quarters), ("snapkv", snap_quarters)):
            rounds = [[10 * q, al] for q, al in enumerate(quarters)]
            runs.append({"request": request, "policy": policy, "al": float(np.mean(quarters)), "rounds": rounds})
    return {"runs": runs, "looping": looping, "osl": [40] * len(looping)}


def test_paired_difference_is_the_mean_of_per_request_differences(staleness):
    rng = np.random.default_rng(0)
    swa = rng.uniform(1, 4, size=(8, 4)).round(2).tolist()
    snap = rng.uniform(2, 6, size=(8, 4)).round(2).tolist()
    looping = [False] * 7 + [True]  # the looping request is left out
    cell = _cell(swa, snap, looping)
    late = staleness.paired_difference(cell, "swa", "snapkv", quarter=3)
    expected = np.mean([swa[r][3] - snap[r][3] for r in range(7)])
    assert late["n"] == 7
    assert late["estimate"] == pytest.approx(expected)
    assert late["low"] <= late["estimate"] <= late["high"]
    overall = staleness.paired_difference(cell, "swa", "snapkv")
    assert overall["estimate"] == pytest.approx(np.mean([np.mean(swa[r]) - np.mean(snap[r]) for r in range(7)]))


def test_a_clear_late_gap_is_decided_and_a_noisy_one_says_its_size(staleness):
    # SWA behind early, ahead late by about 2 AL in every request: the late CI excludes 0.
    cell = _cell([[1, 2, 3, 5 + 0.1 * r] for r in range(6)], [[3, 3, 3, 3] for _ in range(6)], [False] * 6)
    late = staleness.paired_difference(cell, "swa", "snapkv", quarter=3)
    assert late["low"] > 0
    # Differences of either sign: the CI holds 0 and the power line asks for more requests than were run.
    noisy = _cell([[3, 3, 3, 3 + s] for s in (2, -2, 1.5, -1.8, 2.2, -1.7)], [[3, 3, 3, 3]] * 6, [False] * 6)
    undecided = staleness.paired_difference(noisy, "swa", "snapkv", quarter=3)
    assert undecided["low"] < 0 < undecided["high"]
    assert undecided["requests_for_observed_gap"] > undecided["n"]
    assert "minimum detectable gap at 6 requests" in staleness._size_text(undecided)


def test_fewer_than_two_pairs_give_none(staleness):
    cell = _cell([[1, 2, 3, 4], [1, 2, 3, 4]], [[2, 2, 2, 2], [2, 2, 2, 2]], [False, True])
    assert staleness.paired_difference(cell, "swa", "snapkv", quarter=3) is None
