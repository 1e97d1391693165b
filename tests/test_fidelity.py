"""Replay fidelity on SmolLM2-135M: replay vs the closed loop on the same requests (slow, small).

One small measurement (2 requests x 64 greedy tokens, B = 128) shared by the tests below.
"""

from __future__ import annotations

from typing import Any

import pytest

from rift_ada.calibrate.fidelity import FidelityCase, measure_fidelity

SMALL_T0 = FidelityCase(
    n_requests=2, output_tokens=64, budget=128, temperature=0.0, periodic=(16,), arm_ages=(0, 16, 32, 64)
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {row["policy"]: row for row in measure_fidelity(tmp_path_factory.mktemp("fidelity"), SMALL_T0)}


@pytest.mark.slow
def test_refresh_counts_and_the_never_refreshed_policy_match_the_loop(rows: dict[str, dict[str, Any]]) -> None:
    assert set(rows) == {"stat", "periodic:16", "gate"}
    # Periodic refresh happens as often in replay as in the loop.
    assert rows["periodic:16"]["replay_refreshes"] == rows["periodic:16"]["closed_refreshes"] > 0
    assert rows["stat"]["replay_refreshes"] == rows["stat"]["closed_refreshes"] == 0
    # stat reads one arm, exactly as the teacher-forced loop runs it: no gap at all.
    assert abs(rows["stat"]["al_gap"]) < 1e-12


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="measured 2026-11-30 on main: stat and periodic:16 exact (6 refreshes both ways), gate replay AL "
    "3.684 vs closed loop 3.778 (-2.5 %: replay takes one round more, 35 against 34; docs/calibration.md)",
)
def test_mean_al_gap_within_two_percent_at_t0(rows: dict[str, dict[str, Any]]) -> None:
    for row in rows.values():
        assert abs(row["al_gap"]) <= 0.02, row
