"""Controller session semantics: strides, ages, signals (hand-computed), missing signals, policies."""

from __future__ import annotations

import json
import math
import statistics
import time

import pytest

from rift_ada import Controller, ControllerError, Session
from rift_ada.controller import SIGNAL_NAMES, knot_transform, make_controller_dict


def controller(policy: dict, **schedule_and_signals: object) -> Controller:
    schedule = {k: v for k, v in schedule_and_signals.items() if k in ("decision_stride", "min_age", "max_age")}
    acceptance = {k: v for k, v in schedule_and_signals.items() if k in ("ewma_alpha", "rounds")}
    data = make_controller_dict(
        policy,
        name="test",
        draft="draft",
        target="target",
        temperature=0.0,
        schedule=schedule,
        signals={"acceptance": acceptance} if acceptance else None,
    )
    return Controller.from_dict(data)


NEVER = {"kind": "gate", "any": [{"signal": "acceptance", "op": "<", "value": -1.0}]}
ALWAYS = {"kind": "periodic", "interval": 1}


def test_defaults_follow_design() -> None:
    ctl = controller(NEVER)
    data = ctl.to_dict()
    assert data["cache"] == {
        "budget": 8192,
        "sw_ratio": 0.5,
        "scorer": "snapkv",
        "block_size": 128,
        "obs_window": 64,
    }
    assert data["schedule"] == {"decision_stride": 8, "min_age": 32, "max_age": 768}
    assert data["signals"] == {"acceptance": {"ewma_alpha": 0.4, "rounds": 4}}
    assert isinstance(ctl.new_session(), Session)
    assert json.loads(json.dumps(data)) == data


def test_decisions_only_when_a_stride_boundary_is_crossed() -> None:
    session = controller(ALWAYS, decision_stride=8, min_age=0).new_session()
    assert session.decide(5) is False and session.decisions == 0
    assert session.decide(8) is True and session.decisions == 1
    assert session.decide(12) is False and session.decisions == 1
    assert session.decide(15) is False
    assert session.decide(40) is True and session.decisions == 2  # at most one decision per call
    assert session.decide(47) is False
    assert session.refresh_positions == [8, 40]


def test_min_age_blocks_and_max_age_forces() -> None:
    session = controller(ALWAYS, decision_stride=8, min_age=16, max_age=1000).new_session()
    assert [session.decide(n) for n in (8, 16, 24, 32, 40)] == [False, True, False, True, False]
    session = controller(NEVER, decision_stride=8, min_age=0, max_age=20).new_session()
    assert [session.decide(n) for n in (8, 16, 24, 32, 40, 48)] == [False, False, True, False, False, True]
    assert session.refreshes == 2 and session.last_refresh == 48


def test_max_age_below_stride_refreshes_at_every_decision() -> None:
    session = controller(NEVER, decision_stride=8, min_age=0, max_age=3).new_session()
    assert all(session.decide(n) for n in range(8, 80, 8))


def test_min_age_equal_max_age() -> None:
    session = controller(ALWAYS, decision_stride=8, min_age=24, max_age=24).new_session()
    assert [session.decide(n) for n in (8, 16, 24, 32, 40, 48)] == [False, False, True, False, False, True]


def test_acceptance_ewma_hand_computed() -> None:
    session = controller(NEVER, ewma_alpha=0.5, rounds=4, decision_stride=8).new_session()
    for accepted_len in (2, 4, 6, 8, 10):
        session.record_round(accepted_len, [])
    session.decide(8)
    # last 4 rounds, oldest first: 4, 6, 8, 10 -> 4, 5, 6.5, 8.25
    assert session.last_signals["acceptance"] == 8.25


def test_acceptance_ewma_with_fewer_rounds_and_default_alpha() -> None:
    session = controller(NEVER).new_session()
    session.record_round(3.0, [])
    session.record_round(5.0, [])
    session.decide(8)
    assert session.last_signals["acceptance"] == pytest.approx(0.4 * 5.0 + 0.6 * 3.0)


def test_entropy_is_the_mean_since_the_previous_decision() -> None:
    session = controller(NEVER, decision_stride=8).new_session()
    session.record_round(3, [1.0, 2.0])
    session.record_round(3, [3.0])
    session.decide(6)  # no decision: entropies keep accumulating
    session.record_round(3, [6.0])
    session.decide(9)
    assert session.last_signals["entropy"] == pytest.approx(3.0)
    session.record_round(8, [0.5, 1.5])
    session.decide(17)
    assert session.last_signals["entropy"] == pytest.approx(1.0)
    # 4 rounds since the prefill only now: this decision takes the baselines
    assert session.last_signals["entropy_rise"] == 0.0
    session.record_round(8, [4.0])
    session.decide(25)
    assert session.last_signals["entropy_rise"] == pytest.approx(4.0 - 1.0)


def test_baselines_wait_until_the_acceptance_window_lies_after_the_refresh() -> None:
    session = controller(NEVER, decision_stride=8, min_age=0, max_age=16, rounds=4).new_session()
    for _ in range(2):
        session.record_round(4, [1.0])
    session.decide(8)  # 2 rounds since the prefill: no baseline, the deterioration signals are missing
    assert session.last_signals["acceptance_drop"] is None and session.last_signals["entropy_rise"] is None
    for _ in range(2):
        session.record_round(4, [1.0])
    assert session.decide(16) is True  # max_age; 4 rounds: baselines taken (then dropped by the refresh)
    assert session.last_signals["acceptance_drop"] == 0.0
    for accepted_len in (2, 2, 2):
        session.record_round(accepted_len, [2.0])
    session.decide(22)  # no decision (same stride)
    session.decide(24)  # 3 rounds after the refresh: the window still holds a pre-refresh round
    assert session.last_signals["acceptance_drop"] is None
    session.record_round(2, [2.0])
    session.decide(26)
    session.record_round(6, [3.0])
    session.decide(32)  # max_age again, with the baseline set at this decision first
    assert session.last_signals["acceptance_drop"] == 0.0 and session.last_signals["entropy_rise"] == 0.0


def test_drop_and_rise_baselines_reset_on_refresh() -> None:
    session = controller(NEVER, decision_stride=8, min_age=0, max_age=24, rounds=1).new_session()
    session.record_round(8, [1.0])
    session.decide(8)
    assert session.last_signals["acceptance_drop"] == 0.0 and session.last_signals["entropy_rise"] == 0.0
    session.record_round(5, [1.5])
    session.decide(13)
    session.record_round(3, [2.0])
    session.decide(16)
    assert session.last_signals["acceptance_drop"] == pytest.approx(8 - 3)
    assert session.last_signals["entropy_rise"] == pytest.approx(((1.5 + 2.0) / 2) - 1.0)
    session.record_round(8, [2.5])
    assert session.decide(24) is True  # max_age
    session.record_round(4, [0.1])
    session.decide(32)
    assert session.last_signals["acceptance_drop"] == 0.0 and session.last_signals["entropy_rise"] == 0.0


def test_query_drift_from_known_vectors() -> None:
    session = controller(NEVER, decision_stride=8, min_age=0, max_age=16).new_session()
    session.record_queries([[[1.0, 0.0], [1.0, 0.0]]])  # first summary: the reference
    session.record_round(8, [1.0])
    session.decide(8)
    assert session.last_signals["query_drift"] == pytest.approx(0.0)
    session.record_queries([[[2.0, 0.0], [3.0, 3.0]]])
    session.record_round(8, [1.0])
    assert session.decide(16) is True  # max_age refresh: the reference becomes the current summary
    assert session.last_signals["query_drift"] == pytest.approx(1.0 - (1.0 + math.sqrt(0.5)) / 2)
    session.record_round(8, [1.0])
    session.decide(24)
    assert session.last_signals["query_drift"] == pytest.approx(0.0)
    session.record_queries([[[0.0, -1.0], [1.0, 1.0]]])
    session.record_round(8, [1.0])
    session.decide(32)
    assert session.last_signals["query_drift"] == pytest.approx(1.0 - (0.0 + 1.0) / 2)


def test_query_summary_shape_mismatch_is_a_value_error() -> None:
    session = controller(NEVER).new_session()
    session.record_queries([[[1.0, 0.0]]])
    with pytest.raises(ValueError):
        session.record_queries([[[1.0, 0.0]], [[1.0, 0.0]]])


def test_explicit_drift_overrides_and_is_cleared_by_a_refresh() -> None:
    gate = {"kind": "gate", "any": [{"signal": "query_drift", "op": ">=", "value": 0.5}]}
    session = controller(gate, decision_stride=8, min_age=0).new_session()
    session.record_query_drift(0.7)
    assert session.decide(8) is True
    assert session.decide(16) is False  # the old value measured against the old reference is gone
    assert session.last_signals["query_drift"] is None
    session.record_query_drift(float("nan"))  # NaN = missing
    assert session.decide(24) is False


def test_missing_signals_do_not_fire_rules_and_contribute_zero_to_scores() -> None:
    signal_rules = [{"signal": name, "op": ">=", "value": -1e9} for name in ("entropy", "query_drift")]
    session = controller({"kind": "gate", "any": signal_rules}, min_age=0).new_session()
    assert session.decide(8) is False
    assert session.last_signals == {name: None for name in SIGNAL_NAMES}
    term = {"signal": "query_drift", "orientation": 1, "mean": 0.0, "scale": 1.0, "weight": 1.0}
    assert controller({"kind": "score", "terms": [term], "threshold": 0.1}, min_age=0).new_session().decide(8) is False
    assert controller({"kind": "score", "terms": [term], "threshold": 0.0}, min_age=0).new_session().decide(8) is True


def test_score_policy_hand_computed() -> None:
    terms = [
        {"signal": "entropy", "orientation": 1, "mean": 1.0, "scale": 0.5, "weight": 2.0},
        {"signal": "acceptance", "orientation": -1, "mean": 6.0, "scale": 2.0, "weight": 1.0},
    ]
    # entropy 1.5 -> z = 1; acceptance 4 -> z = +1: score = 2 * 1 + 1 * 1 = 3
    for threshold, fires in ((3.0, True), (3.0001, False)):
        session = controller(
            {"kind": "score", "terms": terms, "threshold": threshold}, min_age=0, rounds=1
        ).new_session()
        session.record_round(4, [1.0, 2.0])
        assert session.decide(8) is fires


def test_knot_transform_is_monotone_piecewise_linear_and_clamped() -> None:
    transform = knot_transform([[-1.0, -2.0], [0.0, 0.0], [2.0, 1.0]])
    assert transform(-5.0) == -2.0 and transform(-1.0) == -2.0
    assert transform(-0.5) == pytest.approx(-1.0)
    assert transform(0.0) == 0.0 and transform(1.0) == pytest.approx(0.5)
    assert transform(2.0) == 1.0 and transform(50.0) == 1.0
    assert math.isnan(transform(float("nan")))


def test_score_with_knots() -> None:
    term = {
        "signal": "entropy",
        "orientation": 1,
        "mean": 0.0,
        "scale": 1.0,
        "weight": 1.0,
        "knots": [[0.0, 0.0], [1.0, 0.2], [3.0, 1.0]],
    }
    for entropy, fires in ((2.0, True), (1.9, False), (10.0, True)):
        session = controller({"kind": "score", "terms": [term], "threshold": 0.6}, min_age=0).new_session()
        session.record_round(4, [entropy])
        assert session.decide(8) is fires, entropy


def test_gate_any_all_combinations() -> None:
    gate = {
        "kind": "gate",
        "all": [
            {"signal": "acceptance", "op": "<", "value": 5.0},
            {
                "any": [
                    {"signal": "entropy", "op": ">", "value": 1.0},
                    {"signal": "entropy", "op": "<=", "value": 0.1},
                    {"signal": "query_drift", "op": ">=", "value": 0.5},
                ]
            },
        ],
    }
    cases = [
        ((4, [2.0], None), True),
        ((6, [2.0], None), False),
        ((4, [0.5], None), False),
        ((4, [0.05], None), True),
        ((4, [0.5], 0.6), True),
    ]
    for (accepted_len, entropies, drift), expected in cases:
        session = controller(gate, min_age=0).new_session()
        session.record_round(accepted_len, entropies)
        if drift is not None:
            session.record_query_drift(drift)
        assert session.decide(8) is expected


def test_sessions_are_independent() -> None:
    ctl = controller(ALWAYS, min_age=0)
    first, second = ctl.new_session(), ctl.new_session()
    assert first.decide(8) is True
    assert second.refreshes == 0 and second.decide(7) is False


def test_controller_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Controller.from_dict({})
    assert issubclass(ControllerError, ValueError)


def test_decide_is_fast() -> None:
    gate = {
        "kind": "gate",
        "any": [
            {"signal": "acceptance", "op": "<=", "value": 2.0},
            {
                "all": [
                    {"signal": "entropy", "op": ">=", "value": 9.0},
                    {"signal": "query_drift", "op": ">=", "value": 0.5},
                ]
            },
        ],
    }
    session = controller(gate).new_session()
    entropies = [0.5] * 11
    timings = []
    n = 0
    for i in range(3000):
        n += 1 + i % 11
        session.record_round(1 + i % 11, entropies)
        session.record_query_drift(0.1)
        start = time.perf_counter()
        session.decide(n)
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 50e-6  # target 5 µs; generous bound for shared CI machines
