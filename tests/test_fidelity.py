"""Replay fidelity on SmolLM2-135M: replay vs the closed loop on the same requests (slow, small)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rift_ada.calibrate.fidelity import FidelityCase, measure_fidelity

SMALL_T0 = FidelityCase(
    n_requests=2, output_tokens=64, budget=128, temperature=0.0, periodic=(16,), arm_ages=(0, 16, 32, 64)
)


@pytest.mark.slow
def test_replay_matches_the_closed_loop_at_t0(tmp_path: Path) -> None:
    rows = {row["policy"]: row for row in measure_fidelity(tmp_path, SMALL_T0)}
    assert set(rows) == {"stat", "periodic:16", "gate"}
    # Periodic refresh happens at the same positions in replay and in the loop.
    assert rows["periodic:16"]["replay_refreshes"] == rows["periodic:16"]["closed_refreshes"] > 0
    assert rows["stat"]["replay_refreshes"] == rows["stat"]["closed_refreshes"] == 0
    for row in rows.values():  # teacher-forced T = 0: replay's mean AL within 2% of the loop's
        assert abs(row["al_gap"]) <= 0.02, row
