"""Replay: bit-for-bit parity with a Controller stepped by hand, hand-computed rounds, result summaries."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rift_ada import Controller
from rift_ada.collectors.probe_traces import ProbeTraces, arm_age
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import make_controller_dict, validate_controller_dict
from rift_ada.policies.replay import named_policy_controller, replay, replay_many

# ----------------------------------------------------------------------------------------------
# The scalar reference: a real Controller session per request, stepped round by round.


PHI = 0.6180339887498949
SQRT2 = 0.41421356237309515


def arm_for_round(traces: ProbeTraces, age: int, request: int, n: int) -> int:
    """The arm a round reads: between neighbouring probed ages, the older one when the dither < w."""
    grid = sorted((arm_age(name), index) for index, name in enumerate(traces.arms) if arm_age(name) is not None)
    if age < grid[0][0]:
        return grid[0][1]
    if age >= grid[-1][0]:
        return grid[-1][1]
    j = max(i for i, (grid_age, _) in enumerate(grid) if grid_age <= age)
    (young, young_arm), (old, old_arm) = grid[j], grid[j + 1]
    weight = (age - young) / (old - young)
    dither = math.modf(PHI * (n + 1.0) + SQRT2 * (request + 1.0))[0]
    return old_arm if dither < weight else young_arm


def scalar_replay(
    traces: ProbeTraces,
    controller: dict[str, Any],
    seed: int = 0,
    replica: int = 0,
    replicas: int = 4,
    decisions: list[tuple[int, int, dict[str, float | None]]] | None = None,
) -> list[tuple[list[int], int]]:
    """(refresh positions, rounds) per request, from a Controller driven by hand.

    ``decisions`` collects (request, n_committed, signals) at every decision the session makes.

    At T > 0 position i of request r is accepted under arm a when u[replica, r, i] < p[r, a, i] (p: the
    traces' ``acceptance``, the token-conditional probability where recorded), with
    u = numpy.random.default_rng(seed).random((replicas, R, P)) (the documented sampling contract).
    """
    ctl = Controller.from_dict(controller)
    k = traces.draft_length
    sampled = traces.temperature > 0
    uniforms = np.random.default_rng(seed).random((replicas,) + traces.outcome[:, 0].shape) if sampled else None
    drift = traces.stride_signals.get("query_drift")
    results = []
    for r in range(traces.n_requests):
        osl = int(traces.osl[r])
        session = ctl.new_session()
        n = 0
        rounds = 0
        while n < osl:
            arm = arm_for_round(traces, n - session.last_refresh, r, n)

            def accepted(i: int, r: int = r, arm: int = arm) -> bool:
                value = float(traces.acceptance[r, arm, i])
                if uniforms is None:
                    return value > 0.5
                return bool(uniforms[replica, r, i] < (0.0 if math.isnan(value) else value))

            run = 0
            while run < k and n + run < osl and accepted(n + run):
                run += 1
            accepted_len = min(1 + run, osl - n)
            conditioned = min(accepted_len, k)  # accepted drafts and the first rejected one
            session.record_round(accepted_len, [float(e) for e in traces.entropy[r, arm, n : n + conditioned]])
            n += accepted_len
            if drift is not None:
                session.record_query_drift(float(drift[r, arm, (n - 1) // traces.decision_stride]))
            before = session.decisions
            session.decide(n)
            if decisions is not None and session.decisions > before:
                decisions.append((r, n, session.last_signals))
            rounds += 1
        results.append((list(session.refresh_positions), rounds))
    return results


def assert_same_decisions(traces: ProbeTraces, controller: dict[str, Any], result: Any) -> None:
    expected = scalar_replay(traces, controller)
    for r, (positions, rounds) in enumerate(expected):
        assert result.refresh_positions[r].tolist() == positions, f"request {r}"
        assert result.rounds[r] == rounds, f"request {r}"
        assert result.refreshes[r] == len(positions)
        if rounds:
            assert result.al[r] == traces.osl[r] / rounds


# ----------------------------------------------------------------------------------------------
# Random traces and policies.

SIGNAL_RANGES = {
    "acceptance": (1.0, 8.0),
    "entropy": (0.0, 2.0),
    "query_drift": (0.0, 0.5),
    "acceptance_drop": (-3.0, 3.0),
    "entropy_rise": (-1.0, 1.0),
}


@st.composite
def random_traces(draw: st.DrawFn) -> ProbeTraces:
    n_req = draw(st.integers(1, 4))
    n_pos = draw(st.integers(1, 160))
    grid = sorted(draw(st.sets(st.sampled_from([0, 4, 8, 16, 32, 64]), min_size=1, max_size=4)))
    if draw(st.integers(0, 3)):  # usually probe up to the longest response, as collect does by default
        grid.append(200)
    arms = tuple(f"age:{a}" for a in grid) + ("stat", "full")
    temperature = draw(st.sampled_from([0.0, 1.0]))
    stride = draw(st.integers(1, 12))
    draft_length = draw(st.integers(1, 11))
    seed = draw(st.integers(0, 2**32 - 1))
    drift_mode = draw(st.sampled_from(["present", "with_nan", "absent"]))
    rng = np.random.default_rng(seed)
    quality = rng.uniform(0.3, 1.0, (n_req, len(arms), 1))
    if temperature == 0:
        outcome = (rng.random((n_req, len(arms), n_pos)) < quality).astype(np.float32)
    else:
        outcome = (rng.random((n_req, len(arms), n_pos)) ** 0.3 * quality).astype(np.float32)
    entropy = rng.uniform(0.0, 2.0, (n_req, len(arms), n_pos)).astype(np.float32)
    n_strides = -(-n_pos // stride)
    stride_signals = {}
    if drift_mode != "absent":
        drift = rng.uniform(0.0, 0.5, (n_req, len(arms), n_strides)).astype(np.float32)
        if drift_mode == "with_nan":
            drift[rng.random(drift.shape) < 0.2] = np.nan
        stride_signals["query_drift"] = drift
    osl = rng.integers(max(0, n_pos - 40), n_pos + 1, n_req)
    for r, length in enumerate(osl):
        outcome[r, :, length:] = np.nan
        entropy[r, :, length:] = np.nan
    return ProbeTraces(
        requests={
            "request_id": np.array([f"r{i}" for i in range(n_req)]),
            "dataset": np.array(["t"] * n_req),
            "category": np.array(["c"] * n_req),
            "tier": np.array(["low"] * n_req),
            "isl": np.zeros(n_req, dtype=np.int64),
            "osl": osl.astype(np.int64),
        },
        arms=arms,
        outcome=outcome,
        entropy=entropy,
        stride_signals=stride_signals,
        temperature=temperature,
        draft_length=draft_length,
        decision_stride=stride,
    )


def threshold(draw: st.DrawFn, signal: str) -> float:
    low, high = SIGNAL_RANGES[signal]
    return draw(st.floats(low, high, allow_nan=False))


@st.composite
def gate_node(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    if depth >= 2 or draw(st.booleans()):
        signal = draw(st.sampled_from(list(SIGNAL_RANGES)))
        return {
            "signal": signal,
            "op": draw(st.sampled_from(["<=", "<", ">=", ">"])),
            "value": threshold(draw, signal),
        }
    key = draw(st.sampled_from(["any", "all"]))
    return {key: draw(st.lists(gate_node(depth + 1), min_size=1, max_size=3))}


@st.composite
def score_term(draw: st.DrawFn) -> dict[str, Any]:
    signal = draw(st.sampled_from(list(SIGNAL_RANGES)))
    low, high = SIGNAL_RANGES[signal]
    term = {
        "signal": signal,
        "orientation": draw(st.sampled_from([1, -1])),
        "mean": draw(st.floats(low, high)),
        "scale": draw(st.floats(0.05, 3.0)),
        "weight": draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])),
    }
    if draw(st.booleans()):
        xs = sorted(draw(st.sets(st.floats(-3.0, 3.0), min_size=2, max_size=4)))
        ys = sorted(draw(st.lists(st.floats(-2.0, 2.0), min_size=len(xs), max_size=len(xs))))
        term["knots"] = [[x, y] for x, y in zip(xs, ys, strict=True)]
    return term


@st.composite
def random_policy(draw: st.DrawFn, kind: str | None = None) -> dict[str, Any]:
    kind = kind or draw(st.sampled_from(["periodic", "gate", "score"]))
    if kind == "periodic":
        policy: dict[str, Any] = {"kind": "periodic", "interval": draw(st.integers(1, 100))}
    elif kind == "gate":
        root = draw(gate_node())
        policy = {"kind": "gate", **(root if "signal" not in root else {"any": [root]})}
    else:
        policy = {
            "kind": "score",
            "terms": draw(st.lists(score_term(), min_size=1, max_size=4)),
            "threshold": draw(st.floats(-2.0, 3.0)),
        }
    stride = draw(st.integers(1, 16))
    min_age = draw(st.sampled_from([0, 0, 4, 16, 32, draw(st.integers(0, 64))]))
    max_age = min_age + draw(st.sampled_from([0, 0, 3, 17, 64, 1000, draw(st.integers(0, 128))]))
    return make_controller_dict(
        policy,
        name=f"random-{kind}",
        draft="d",
        target="t",
        temperature=0.0,
        schedule={"decision_stride": stride, "min_age": min_age, "max_age": max_age},
        signals={
            "acceptance": {
                "ewma_alpha": draw(st.sampled_from([0.4, 1.0, 0.1, 0.73])),
                "rounds": draw(st.integers(1, 5)),
            }
        },
    )


# ----------------------------------------------------------------------------------------------
# Parity.

PARITY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ages_needed(traces: ProbeTraces, controller: dict[str, Any]) -> int:
    """Oldest working-set age the controller can read on these traces (independent of replay)."""
    cap = controller["schedule"]["max_age"]
    if controller["policy"]["kind"] == "periodic":
        cap = min(cap, max(controller["policy"]["interval"], controller["schedule"]["min_age"]))
    return min(cap, max(int(traces.osl.max()) - 1, 0))


def checked_replay(traces: ProbeTraces, controllers: list[dict[str, Any]]) -> list[Any] | None:
    """Replay with one replica; None (after checking the message) when the arms are too young."""
    oldest_arm = int(traces.age_grid.max())
    too_old = [c for c in controllers if ages_needed(traces, c) > oldest_arm]
    if too_old:
        with pytest.raises(ValueError, match=rf"cover ages {int(traces.age_grid.min())}\.\.{oldest_arm} only"):
            replay_many(traces, controllers)
        return None
    return replay_many(traces, controllers, record_refreshes=True, replicas=1)


@PARITY
@given(traces=random_traces(), controller=random_policy("periodic"))
def test_periodic_replay_matches_controller(traces: ProbeTraces, controller: dict[str, Any]) -> None:
    results = checked_replay(traces, [controller])
    if results is not None:
        assert_same_decisions(traces, controller, results[0])


@PARITY
@given(traces=random_traces(), controller=random_policy("gate"))
def test_gate_replay_matches_controller(traces: ProbeTraces, controller: dict[str, Any]) -> None:
    results = checked_replay(traces, [controller])
    if results is not None:
        assert_same_decisions(traces, controller, results[0])


@PARITY
@given(traces=random_traces(), controller=random_policy("score"))
def test_score_replay_matches_controller(traces: ProbeTraces, controller: dict[str, Any]) -> None:
    results = checked_replay(traces, [controller])
    if results is not None:
        assert_same_decisions(traces, controller, results[0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces=random_traces(), controllers=st.lists(random_policy(), min_size=2, max_size=5))
def test_batched_replay_matches_controller(traces: ProbeTraces, controllers: list[dict[str, Any]]) -> None:
    results = checked_replay(traces, controllers)
    for controller, result in zip(controllers, results or [], strict=False):
        assert_same_decisions(traces, controller, result)


@st.composite
def score_siblings(draw: st.DrawFn) -> list[dict[str, Any]]:
    """2-4 score controllers reading the same signals with the same knot counts, their numbers drawn apart."""
    first = draw(random_policy("score"))
    siblings = [first]
    for _ in range(draw(st.integers(1, 3))):
        sibling = copy.deepcopy(first)
        terms = sibling["policy"]["terms"]
        for j, drawn in enumerate(draw(st.lists(score_term(), min_size=len(terms), max_size=len(terms)))):
            drawn.pop("knots", None)
            if "knots" in terms[j]:  # keep the skeleton: as many knots, other values
                count = len(terms[j]["knots"])
                xs = sorted(draw(st.sets(st.floats(-3.0, 3.0), min_size=count, max_size=count)))
                ys = sorted(draw(st.lists(st.floats(-2.0, 2.0), min_size=count, max_size=count)))
                drawn["knots"] = [[x, y] for x, y in zip(xs, ys, strict=True)]
            terms[j] = {**drawn, "signal": terms[j]["signal"]}
        sibling["policy"]["threshold"] = draw(st.floats(-2.0, 3.0))
        siblings.append(validate_controller_dict(sibling))
    return siblings


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces=random_traces(), controllers=score_siblings())
def test_score_policies_with_their_own_numbers_replay_as_the_controller(
    traces: ProbeTraces, controllers: list[dict[str, Any]]
) -> None:
    """One score group, one column of numbers (and knots) per policy: each lane reads its own."""
    results = checked_replay(traces, controllers)
    for controller, result in zip(controllers, results or [], strict=False):
        assert_same_decisions(traces, controller, result)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    "schedule",
    [
        {"decision_stride": 8, "min_age": 0, "max_age": 768},
        {"decision_stride": 8, "min_age": 64, "max_age": 64},
        {"decision_stride": 16, "min_age": 0, "max_age": 5},
        {"decision_stride": 1, "min_age": 0, "max_age": 0},
        {"decision_stride": 3, "min_age": 32, "max_age": 100},
    ],
)
def test_schedule_edges_on_synthetic_traces(temperature: float, schedule: dict[str, int]) -> None:
    traces = synthetic_traces(3, 300, temperature=temperature, seed=7, vary_length=True)
    gate = {
        "kind": "gate",
        "any": [
            {"signal": "acceptance", "op": "<=", "value": 6.0},
            {
                "all": [
                    {"signal": "entropy_rise", "op": ">", "value": 0.2},
                    {"signal": "query_drift", "op": ">=", "value": 0.01},
                ]
            },
        ],
    }
    controller = make_controller_dict(
        gate, name="edge", draft="d", target="t", temperature=temperature, schedule=schedule
    )
    assert_same_decisions(traces, controller, replay(traces, controller, record_refreshes=True, replicas=1))


# ----------------------------------------------------------------------------------------------
# Hand-computed rounds.


def one_request_traces(
    outcome: list[float],
    temperature: float,
    draft_length: int,
    osl: int | None = None,
    entropy: list[float] | None = None,
) -> ProbeTraces:
    n_pos = len(outcome)
    arms = ("age:0", "stat", "full")
    row = np.array(outcome, dtype=np.float32)
    entropy_row = np.array(entropy if entropy is not None else [0.5] * n_pos, dtype=np.float32)
    return ProbeTraces(
        requests={
            "request_id": np.array(["a"]),
            "dataset": np.array(["t"]),
            "category": np.array(["c"]),
            "tier": np.array(["low"]),
            "isl": np.array([0]),
            "osl": np.array([osl if osl is not None else n_pos]),
        },
        arms=arms,
        outcome=np.tile(row, (1, 3, 1)),
        entropy=np.tile(entropy_row, (1, 3, 1)),
        stride_signals={},
        temperature=temperature,
        draft_length=draft_length,
        decision_stride=8,
    )


def test_accepted_length_from_match_bits_at_t0() -> None:
    bits = [1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    traces = one_request_traces(bits, 0.0, draft_length=3)
    # rounds: n=0 -> 1,1,0 -> AL 3; n=3 -> 1,1,1 -> AL 4 (K + 1 cap); n=7 -> 1,0 -> 2; n=9 -> 0 -> 1;
    # n=10 -> 1,1,1 but only 3 positions left -> cut at OSL: AL 3.
    result = replay(traces, "full", position_bin=4)
    assert result.rounds.tolist() == [5]
    assert result.committed.tolist() == [13]
    assert result.al[0] == pytest.approx(13 / 5)
    # bins of 4: rounds starting at 0, 3 -> bin 0 (AL 3, 4); 7 -> bin 1 (2); 9, 10 -> bin 2 (1, 3)
    assert result.al_by_position[0].tolist() == [3.5, 2.0, 2.0, pytest.approx(np.nan, nan_ok=True)]
    assert result.position_edges.tolist() == [0, 4, 8, 12, 16]


def test_al_by_position_equals_the_rounds_walked_by_hand() -> None:
    traces = synthetic_traces(12, 700, seed=5, vary_length=True)
    k, bin_width = traces.draft_length, 37
    # Batched with refreshing policies, so the lockstep walk compacts lanes that finish at different times.
    stat, full, *_ = replay_many(traces, ["stat", "full", "periodic:64", "periodic:256"], position_bin=bin_width)
    for result, arm in ((stat, "stat"), (full, "full")):
        matches = traces.outcome[:, traces.arm_index(arm)] > 0.5
        for r in range(traces.n_requests):
            osl, n, lengths = int(traces.osl[r]), 0, {}
            while n < osl:
                run = 0
                while run < k and n + run < osl and matches[r, n + run]:
                    run += 1
                accepted_len = min(1 + run, osl - n)
                lengths.setdefault(n // bin_width, []).append(accepted_len)
                n += accepted_len
            expected = [np.mean(lengths[b]) if b in lengths else np.nan for b in range(len(result.position_edges) - 1)]
            assert np.array_equal(result.al_by_position[r], expected, equal_nan=True), (arm, r)
            assert result.rounds[r] == sum(len(v) for v in lengths.values()) and result.committed[r] == osl


def test_osl_shorter_than_positions_at_t0() -> None:
    traces = one_request_traces([1] * 20, 0.0, draft_length=11, osl=15)
    result = replay(traces, "stat")
    assert result.rounds.tolist() == [2] and result.committed.tolist() == [15]  # AL 12, then 3 (cut)


def test_sampled_accepted_length_at_t1() -> None:
    bits = [1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    # Probabilities 0 and 1 make sampling exact: the same rounds as the match bits at T = 0.
    exact = replay(one_request_traces([float(b) for b in bits], 1.0, draft_length=3), "full", replicas=3, seed=5)
    assert exact.rounds.tolist() == [5] and exact.replicas == 3 and exact.mean_al_std == 0.0
    # p = 0.5 per position, K = 3: E[AL] = 1 + 0.5 + 0.25 + 0.125 = 1.875 per round.
    traces = one_request_traces([0.5] * 4000, 1.0, draft_length=3)
    result = replay(traces, "full", replicas=8, seed=1)
    assert result.mean_al == pytest.approx(1.875, rel=0.02)
    assert result.replicas == 8 and result.seed == 1 and result.mean_al_std > 0.0
    assert float(result.rounds[0]) != int(result.rounds[0]) or result.mean_al_std > 0  # a mean over replicas
    assert replay(traces, "full", replicas=8, seed=1).mean_al == result.mean_al  # seeded
    assert replay(traces, "full", replicas=8, seed=2).mean_al != result.mean_al
    assert result.to_dict()["seed"] == 1 and result.to_dict()["replicas"] == 8


def two_arm_traces(old_age: int, n_pos: int, temperature: float = 0.0) -> ProbeTraces:
    """age:0 always matches, age:old_age never does."""
    arms = ("age:0", f"age:{old_age}", "stat", "full")
    outcome = np.zeros((1, len(arms), n_pos), dtype=np.float32)
    outcome[:, 0] = 1.0
    outcome[:, 3] = 1.0
    return ProbeTraces(
        requests={
            "request_id": np.array(["a"]),
            "dataset": np.array(["t"]),
            "category": np.array(["c"]),
            "tier": np.array(["low"]),
            "isl": np.array([0]),
            "osl": np.array([n_pos]),
        },
        arms=arms,
        outcome=outcome,
        entropy=np.full((1, len(arms), n_pos), 0.5, dtype=np.float32),
        stride_signals={},
        temperature=temperature,
        draft_length=3,
        decision_stride=8,
    )


def test_ages_between_arms_interpolate_instead_of_reading_the_younger_arm() -> None:
    traces = two_arm_traces(400, 4000)
    # Refresh only at age 400: ages 0..399 lie between the two arms.
    result = replay(traces, "periodic:400", record_refreshes=True, replicas=1)
    assert result.refresh_positions[0][0] == pytest.approx(400, abs=8)
    # The floor rule would read age:0 (AL = K + 1 = 4) for the whole walk; interpolation reads the
    # older arm (AL 1) with probability age / 400, so the AL falls with age inside each interval.
    assert 1.0 < result.mean_al < 4.0
    rounds = scalar_replay(traces, named_policy_controller("periodic:400"), replicas=1)[0][1]
    assert result.rounds[0] == rounds
    young = replay(traces, "periodic:40").mean_al
    assert young > result.mean_al  # a younger working set reads the fresh arm more often


def test_policy_beyond_the_probed_ages_is_refused() -> None:
    traces = two_arm_traces(256, 1000)
    gate = make_controller_dict(
        {"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 2.0}]},
        name="gate",
        draft="d",
        target="t",
        temperature=0.0,
        schedule={"max_age": 768},
    )
    with pytest.raises(ValueError, match=r"'gate' can reach working-set ages up to 768 .* cover ages 0\.\.256 only"):
        replay(traces, gate)
    with pytest.raises(ValueError, match=r"ages up to 512"):
        replay_many(traces, ["periodic:128", "periodic:512"])
    assert replay(traces, "periodic:256").refreshes[0] > 0  # within the range: fine
    short = two_arm_traces(256, 200)  # responses shorter than the oldest arm: no age can exceed it
    assert replay(short, gate).committed.tolist() == [200]


def test_traces_with_fewer_arms_replay_as_traces_probed_with_only_those_arms() -> None:
    traces = synthetic_traces(4, 700, seed=3)  # arms 0, 32, ..., 768, stat, full
    sparse = traces.with_age_grid([0, 64, 128, 768])
    assert sparse.arms == ("age:0", "age:64", "age:128", "age:768", "stat", "full")
    assert sparse.age_grid.tolist() == [0, 64, 128, 768]
    assert np.array_equal(sparse.outcome[:, 1], traces.outcome[:, traces.arm_index("age:64")])
    assert np.array_equal(
        sparse.stride_signals["query_drift"][:, 4], traces.stride_signals["query_drift"][:, traces.arm_index("stat")]
    )
    # The same arms in another order replay identically; without some arms, ages mix other arms.
    shuffled = traces.with_age_grid(list(reversed(traces.age_grid.tolist())))
    assert replay(shuffled, "periodic:96").al.tolist() == replay(traces, "periodic:96").al.tolist()
    assert replay(sparse, "stat").al.tolist() == replay(traces, "stat").al.tolist()
    assert replay(sparse, "periodic:96").al.tolist() != replay(traces, "periodic:96").al.tolist()
    with pytest.raises(KeyError, match="age:16"):
        traces.with_age_grid([16])


def test_named_policies() -> None:
    traces = synthetic_traces(5, 600, seed=2)
    stat, full, periodic, dyn = replay_many(traces, ["stat", "full", "periodic:64", "dyn:64"])
    assert stat.refreshes.sum() == 0 and full.refreshes.sum() == 0
    assert full.mean_al > periodic.mean_al > stat.mean_al
    assert periodic.al.tolist() == dyn.al.tolist()
    assert 1000 / 64 * 0.8 < periodic.refreshes_per_1k <= 1000 / 64
    controller = named_policy_controller("periodic:16")
    assert controller is not None and controller["schedule"]["min_age"] == 0
    assert named_policy_controller("periodic:2000")["schedule"]["max_age"] == 2000
    with pytest.raises(ValueError):
        replay(traces, "sometimes")
    with pytest.raises(ValueError):
        replay(traces, "periodic:0")


def test_result_summary_is_json_able() -> None:
    traces = synthetic_traces(4, 500, seed=3, vary_length=True)
    result = replay(traces, "periodic:128")
    summary = result.to_dict(per_request=True)
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text)["mean_al"] == pytest.approx(result.mean_al)
    assert summary["refreshes"] == int(result.refreshes.sum())
    assert result.refreshes_per_1k == pytest.approx(1000 * result.refreshes.sum() / result.committed.sum())
    assert result.mean_al == pytest.approx(float(np.mean(result.committed / result.rounds)))
    assert result.al_by_position.shape == (4, 2)
    assert (result.committed == traces.osl).all()


def test_batched_equals_individual_and_is_order_independent() -> None:
    traces = synthetic_traces(6, 512, temperature=1.0, seed=4)
    gate = make_controller_dict(
        {"kind": "gate", "any": [{"signal": "entropy", "op": ">=", "value": 1.0}]},
        name="g",
        draft="d",
        target="t",
        temperature=1.0,
    )
    gate_strict = make_controller_dict(
        {"kind": "gate", "any": [{"signal": "entropy", "op": ">=", "value": 2.0}]},
        name="g2",
        draft="d",
        target="t",
        temperature=1.0,
    )
    specs = [gate, "stat", "periodic:32", gate_strict, Controller.from_dict(gate), "full"]
    batched = replay_many(traces, specs)
    for spec, result in zip(specs, batched, strict=True):
        single = replay(traces, spec)
        assert result.rounds.tolist() == single.rounds.tolist()
        assert result.refreshes.tolist() == single.refreshes.tolist()
        assert np.array_equal(result.al_by_position, single.al_by_position, equal_nan=True)
    assert [r.policy for r in batched] == ["g", "stat", "periodic:32", "g2", "g", "full"]


def test_replay_needs_the_arms_it_uses() -> None:
    traces = one_request_traces([1, 1, 1], 0.0, draft_length=2)
    stat_only = ProbeTraces(
        requests=traces.requests,
        arms=("stat",),
        outcome=traces.outcome[:, :1],
        entropy=traces.entropy[:, :1],
        stride_signals={},
        temperature=0.0,
        draft_length=2,
    )
    with pytest.raises(ValueError):
        replay(stat_only, "periodic:8")
    with pytest.raises(ValueError):
        replay(stat_only, "full")
    assert replay(stat_only, "stat").rounds.tolist() == [1]


def test_replay_at_t_above_0_samples_the_acceptance_given_the_token_where_recorded() -> None:
    """token_acceptance, where the traces carry it, is what a T > 0 walk samples (not outcome's sum
    min(p, q)): all ones gives every round K + 1 tokens, all zeros one; without it, outcome as before."""
    import dataclasses

    traces = synthetic_traces(6, 96, temperature=1.0, draft_length=3, seed=4)
    k = traces.draft_length
    before = replay(traces, "stat", replicas=2)
    ones = dataclasses.replace(traces, token_acceptance=np.ones_like(traces.outcome))
    zeros = dataclasses.replace(traces, token_acceptance=np.zeros_like(traces.outcome))
    assert replay(ones, "stat", replicas=2).mean_al == pytest.approx(np.mean(96 / np.ceil(96 / (k + 1))))
    assert replay(zeros, "stat", replicas=2).mean_al == 1.0
    same = dataclasses.replace(traces, token_acceptance=traces.outcome.copy())
    assert replay(same, "stat", replicas=2).mean_al == before.mean_al
    assert 1.0 < before.mean_al < k + 1
    # The scalar reference reads the same column: a deciding policy walks identically.
    mixed = dataclasses.replace(traces, token_acceptance=np.sqrt(traces.outcome))
    controller = named_policy_controller("periodic:32")
    result = replay(mixed, controller, replicas=1, seed=0, record_refreshes=True)
    for r, (positions, rounds) in enumerate(scalar_replay(mixed, controller, seed=0, replicas=1)):
        assert result.refresh_positions[r].tolist() == positions, r
        assert result.rounds[r] == rounds, r
    assert result.mean_al != replay(traces, controller, replicas=1, seed=0).mean_al
