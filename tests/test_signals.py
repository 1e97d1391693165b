"""The signal engine equals the scalar Session for every signal at every decision point.

Random traces (T = 0 and T = 1), random periodic / gate / score controllers (so the walks refresh at
policy-driven points): replay's engine (``decision_points``) and a ``Controller`` session stepped by
hand with the same rounds must report the same five signals, bit for bit, at the same decisions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_replay import ages_needed, random_policy, random_traces, scalar_replay

from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import SIGNAL_NAMES, make_controller_dict
from rift_ada.policies.replay import decision_points
from rift_ada.policies.signals import SignalEngine


def engine_decisions(traces: ProbeTraces, controller: dict[str, Any]) -> list[tuple[int, int, list[float]]]:
    points = decision_points(traces, [controller], replicas=1, seed=0)
    rows = [
        (int(r), int(n), [float(points.signals[name][i]) for name in SIGNAL_NAMES])
        for i, (r, n) in enumerate(zip(points.request, points.position, strict=True))
    ]
    return sorted(rows, key=lambda row: (row[0], row[1]))


def session_decisions(traces: ProbeTraces, controller: dict[str, Any]) -> list[tuple[int, int, list[float]]]:
    found: list[tuple[int, int, dict[str, float | None]]] = []
    scalar_replay(traces, controller, replicas=1, decisions=found)
    rows = [(r, n, [np.nan if s[name] is None else s[name] for name in SIGNAL_NAMES]) for r, n, s in found]
    return sorted(rows, key=lambda row: (row[0], row[1]))


def assert_same_signals(traces: ProbeTraces, controller: dict[str, Any]) -> int:
    engine = engine_decisions(traces, controller)
    session = session_decisions(traces, controller)
    assert [(r, n) for r, n, _ in engine] == [(r, n) for r, n, _ in session]
    for (r, n, got), (_, _, want) in zip(engine, session, strict=True):
        for name, a, b in zip(SIGNAL_NAMES, got, want, strict=True):
            assert (np.isnan(a) and np.isnan(b)) or a == b, f"request {r}, n={n}, {name}: engine {a}, session {b}"
    return len(engine)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces=random_traces(), controller=random_policy())
def test_engine_equals_session_for_every_signal(traces: ProbeTraces, controller: dict[str, Any]) -> None:
    if ages_needed(traces, controller) > int(traces.age_grid.max()):
        return  # refused; tests/test_replay.py checks the refusal
    assert_same_signals(traces, controller)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_equals_session_on_long_walks_with_refreshes(temperature: float) -> None:
    traces = synthetic_traces(3, 700, temperature=temperature, seed=11, vary_length=True)
    gate = make_controller_dict(
        {
            "kind": "gate",
            "any": [
                {"signal": "acceptance_drop", "op": ">=", "value": 0.5},
                {"signal": "entropy_rise", "op": ">=", "value": 0.1},
                {"signal": "query_drift", "op": ">=", "value": 0.05},
            ],
        },
        name="g",
        draft="d",
        target="t",
        temperature=temperature,
    )
    assert assert_same_signals(traces, gate) > 100
    points = decision_points(traces, [gate], replicas=1)
    drop = points.signals["acceptance_drop"]
    assert np.isnan(drop).any() and (drop == 0.0).any() and (drop > 0).any()  # before / at / after baselines


def test_engine_baseline_rule_by_hand() -> None:
    engine = SignalEngine(2, alpha=0.5, rounds=2)
    engine.record_round(np.array([4.0, 4.0]), np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    first = engine.decide(np.array([True, True]))
    assert np.isnan(first["acceptance_drop"]).all()  # one round since the prefill: no baseline
    engine.record_round(np.array([2.0, 6.0]), np.array([2.0, 2.0]), np.array([1.0, 1.0]))
    second = engine.decide(np.array([True, False]))
    assert second["acceptance"].tolist() == [3.0, 5.0]
    assert second["acceptance_drop"][0] == 0.0 and np.isnan(second["acceptance_drop"][1])
    engine.refreshed(np.array([True, False]))
    engine.record_round(np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0, 1.0]))
    third = engine.decide(np.array([True, True]))
    assert np.isnan(third["acceptance_drop"][0])  # refreshed: waits for two rounds again
    assert third["acceptance_drop"][1] == 0.0  # lane 1 takes its baseline now
    assert third["entropy"].tolist() == [0.0, 1.0]  # lane 1 did not decide last time: (1 + 2 + 0) / 3
    with pytest.raises(ValueError, match="unknown signals"):
        SignalEngine(1, alpha=0.4, rounds=4, need=["loss"])


@pytest.mark.parametrize("rounds", [1, 2, 3, 4])
@pytest.mark.parametrize("alpha", [0.4, 0.73, 1.0])
def test_tabulated_window_equals_the_recurrence(rounds: int, alpha: float) -> None:
    """Integer ALs (replay's rounds): the engine's table of windows gives the recurrence's signals bit
    for bit, through decisions, baselines, refreshes and dropped lanes."""
    rng = np.random.default_rng(rounds * 100 + int(alpha * 100))
    lanes, max_accepted = 40, 12
    tabulated = SignalEngine(lanes, alpha=alpha, rounds=rounds, max_accepted=max_accepted)
    recurrence = SignalEngine(lanes, alpha=alpha, rounds=rounds)
    assert tabulated.window_table is not None and recurrence.window_table is None
    kept = np.arange(lanes)
    for step in range(60):
        accepted = rng.integers(0, max_accepted + 1, len(kept)).astype(np.int8)
        entropy_count = np.minimum(accepted, max_accepted - 1)
        entropy_sum = rng.uniform(0.0, 2.0, len(kept)) * entropy_count
        tabulated.record_round(accepted, entropy_sum, entropy_count)
        recurrence.record_round(accepted.astype(np.float64), entropy_sum, entropy_count.astype(np.float64))
        decision = rng.random(len(kept)) < 0.7
        got, want = tabulated.decide(decision), recurrence.decide(decision)
        assert got.keys() == want.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"step {step}, {name}")
        refresh = decision & (rng.random(len(kept)) < 0.2)
        tabulated.refreshed(refresh)
        recurrence.refreshed(refresh)
        if step % 20 == 19:  # lanes finish and leave
            keep = rng.random(len(kept)) < 0.8
            tabulated.keep(keep)
            recurrence.keep(keep)
            kept = kept[keep]


def test_window_table_falls_back_where_it_cannot_hold() -> None:
    """Per-lane alphas and windows too large to tabulate use the recurrence (and agree with it)."""
    per_lane = SignalEngine(3, alpha=np.array([0.4, 0.5, 0.6]), rounds=4, max_accepted=12)
    too_large = SignalEngine(3, alpha=0.4, rounds=5, max_accepted=12)  # 14 ** 5 windows
    assert per_lane.window_table is None and too_large.window_table is None
    for engine in (per_lane, too_large):
        for accepted in ([3, 4, 5], [12, 0, 7]):
            engine.record_round(np.array(accepted, dtype=np.int8), np.zeros(3), np.ones(3))
        acceptance = engine.decide(np.ones(3, dtype=bool))["acceptance"]
        assert acceptance.dtype == np.float64
        np.testing.assert_array_equal(
            acceptance, engine.alpha * np.array([12.0, 0.0, 7.0]) + (1 - engine.alpha) * np.array([3.0, 4.0, 5.0])
        )
