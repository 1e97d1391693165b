"""Policy kinds: JSON round trips (Controller and replay), the registries, score fitting, evaluation, rendering."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from rift_ada import Controller, ControllerError, policy_kinds
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import make_controller_dict, validate_policy
from rift_ada.policies import (
    ScorePolicy,
    ScoreTerm,
    counterfactual_samples,
    evaluate_policies,
    fidelity,
    render_controller,
    replay_many,
)
from rift_ada.policies.gate import GateTools
from rift_ada.policies.kinds import SEARCHED, TOOLS
from rift_ada.policies.replay import replay
from rift_ada.policy_kinds import Gate, Group, Periodic, PolicyKind, Rule

IDENTITY = {"name": "round-trip", "draft": "d", "target": "t", "temperature": 0.0}


def score_policy() -> ScorePolicy:
    return ScorePolicy(
        [
            ScoreTerm("entropy", 1, 0.8, 0.4, 1.0),
            ScoreTerm("acceptance", -1, 6.0, 1.5, 0.5),
            ScoreTerm("acceptance_drop", 1, 0.0, 1.0, 0.7, knots=[[-1.0, -0.5], [0.0, 0.0], [2.0, 2.5]]),
        ],
        threshold=0.8,
    )


def families() -> list[PolicyKind]:
    return [
        Periodic(interval=48),
        Gate(
            Group(
                "any",
                (
                    Rule("acceptance", "<=", 6.0),
                    Group("all", (Rule("entropy", ">=", 1.0), Rule("query_drift", ">=", 0.02))),
                ),
            )
        ),
        Gate(Group("any", (Rule("entropy_rise", ">", 0.3),))),
        score_policy().to_kind(),
    ]


def controller_dict(policy: PolicyKind, **overrides: Any) -> dict[str, Any]:
    return make_controller_dict(policy.to_json(), **IDENTITY, **overrides)


def drive(controller: Controller, rounds: list[tuple[float, list[float], float, int]]) -> list[bool]:
    session = controller.new_session()
    decisions = []
    for accepted_len, entropies, drift, n_committed in rounds:
        session.record_round(accepted_len, entropies)
        session.record_query_drift(drift)
        decisions.append(session.decide(n_committed))
    return decisions


def random_rounds(seed: int) -> list[tuple[float, list[float], float, int]]:
    rng = np.random.default_rng(seed)
    n = 0
    rounds = []
    for _ in range(400):
        accepted_len = int(rng.integers(1, 13))
        n += accepted_len
        rounds.append((accepted_len, rng.uniform(0, 2.5, 11).tolist(), float(rng.uniform(0, 0.05)), n))
    return rounds


@pytest.mark.parametrize("index", range(4))
def test_family_json_controller_round_trip(index: int, tmp_path: Path) -> None:
    policy = families()[index]
    policy_json = policy.to_json()
    assert json.loads(json.dumps(policy_json)) == policy_json
    again = type(policy).from_json(policy_json)
    assert again == policy and again.to_json() == policy_json
    assert policy_kinds.from_json(policy_json) == policy
    assert validate_policy(policy_json) == policy_json
    data = controller_dict(policy, schedule={"min_age": 16})
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(data, indent=2))
    direct = Controller.from_dict(data)
    loaded = Controller.load(path)
    rebuilt = Controller.from_dict(controller_dict(again, schedule={"min_age": 16}))
    assert loaded.to_dict() == direct.to_dict() == rebuilt.to_dict()
    assert direct.policy_kind == policy.kind and direct.signals_used == policy.signals()
    for seed in range(3):
        rounds = random_rounds(seed)
        expected = drive(direct, rounds)
        assert drive(loaded, rounds) == expected
        assert drive(rebuilt, rounds) == expected
    assert any(drive(direct, random_rounds(0)))


def test_family_round_trip_through_replay(tmp_path: Path) -> None:
    traces = synthetic_traces(4, 400, seed=5)
    for index, policy in enumerate(families()):
        data = controller_dict(policy)
        path = tmp_path / f"c{index}.json"
        path.write_text(json.dumps(data))
        from_dict = replay(traces, data, record_refreshes=True)
        from_file = replay(traces, Controller.load(path).to_dict(), record_refreshes=True)
        from_json = replay(
            traces,
            controller_dict(type(policy).from_json(policy.to_json())),
            record_refreshes=True,
        )
        for other in (from_file, from_json):
            assert other.al.tolist() == from_dict.al.tolist()
            assert [p.tolist() for p in other.refresh_positions] == [p.tolist() for p in from_dict.refresh_positions]


def test_kinds_are_validated_frozen_dataclasses() -> None:
    periodic = Periodic(32)
    assert periodic == Periodic.from_json({"kind": "periodic", "interval": 32}) and hash(periodic) == hash(Periodic(32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        periodic.interval = 64  # type: ignore[misc]
    with pytest.raises(ControllerError) as info:
        Periodic(0)
    assert info.value.field == "policy.interval"
    with pytest.raises(ControllerError) as info:
        Gate(Group("any", (Rule("entropy", ">", float("nan")),)))
    assert info.value.field == "policy.any[0].value"
    with pytest.raises(ControllerError) as info:
        Gate(Group("all", (Rule("entropy", ">", 1.0), Rule("entropy", "=", 1.0))))
    assert info.value.field == "policy.all[1].op"
    with pytest.raises(ControllerError) as info:
        Gate(Group("any", (Group("all", (Rule("loss", ">", 1.0),)),)))
    assert info.value.field == "policy.any[0].all[0].signal"
    with pytest.raises(ControllerError):
        ScorePolicy([ScoreTerm("entropy", scale=0.0)])
    with pytest.raises(ControllerError) as info:
        Gate.from_json({"kind": "periodic", "interval": 3})
    assert info.value.field == "policy.any"
    with pytest.raises(ControllerError) as info:
        ScorePolicy.from_policy_json({"kind": "periodic", "interval": 3})
    assert info.value.field == "policy.kind"
    assert ScorePolicy.from_policy_json(score_policy().to_policy_json()).to_kind() == score_policy().to_kind()


def test_gate_tree_walks() -> None:
    gate = families()[1]
    assert isinstance(gate, Gate)
    assert [rule.value for rule in gate.root.rules()] == [6.0, 1.0, 0.02]
    assert gate.signals() == {"acceptance", "entropy", "query_drift"}
    assert GateTools.skeleton(gate) == (
        "gate",
        ("any", (("rule", "acceptance", "<="), ("all", (("rule", "entropy", ">="), ("rule", "query_drift", ">="))))),
    )


def test_every_kind_has_its_tools() -> None:
    """The runtime registry and the policies-side one name the same kinds; the searched ones are gate, score."""
    assert set(TOOLS) == set(policy_kinds.KINDS) == set(policy_kinds.POLICY_KINDS)
    assert all(TOOLS[name].kind is kind for name, kind in policy_kinds.KINDS.items())
    assert SEARCHED == ("gate", "score")
    with pytest.raises(ControllerError, match=r"unknown policy kind 'ramp' \(known: periodic, gate, score\)"):
        policy_kinds.from_json({"kind": "ramp"})


def test_score_values_match_the_controller() -> None:
    score = score_policy()
    controller = Controller.from_dict(
        score.to_controller_dict(
            **IDENTITY, schedule={"min_age": 0, "max_age": 100000}, signals={"acceptance": {"rounds": 1}}
        )
    )
    rng = np.random.default_rng(0)
    for _ in range(50):
        accepted_len = float(rng.integers(1, 13))
        entropy = float(rng.uniform(0, 2))
        session = controller.new_session()
        session.record_round(accepted_len, [entropy])
        fired = session.decide(8)
        value = score.score_values({"entropy": [entropy], "acceptance": [accepted_len], "acceptance_drop": [0.0]})[0]
        assert fired == (value >= score.threshold)


def test_score_fit_finds_the_planted_entropy_signal() -> None:
    traces = synthetic_traces(24, 1024, planted="entropy", seed=11)
    fitted = ScorePolicy().fit(traces)
    weights = {term.signal: term.weight for term in fitted.terms}
    assert weights.get("entropy", 0.0) > 0.0
    entropy_term = next(t for t in fitted.terms if t.signal == "entropy")
    assert entropy_term.orientation == 1 and entropy_term.scale > 0
    assert fitted.fit_info_["correlations"]["entropy"] > 0.3
    assert all(t.weight >= 0 for t in fitted.terms)
    # Only entropy: still found, and the fitted policy runs through the Controller and replay.
    entropy_only = ScorePolicy().fit(traces, signals=["entropy"])
    assert [t.signal for t in entropy_only.terms] == ["entropy"] and entropy_only.terms[0].weight > 0
    result = replay(traces, fitted.to_controller_dict(**IDENTITY))
    assert result.refreshes.sum() > 0


def test_score_fit_threshold_and_samples() -> None:
    traces = synthetic_traces(8, 512, planted="entropy", seed=12)
    samples = counterfactual_samples(traces, horizon=32)
    assert len(samples) == len(samples.signals["entropy"]) > 0
    # decision ages of the periodic walks: 1 .. the oldest arm (plus at most one stride and a round)
    assert samples.age.min() > 0 and samples.age.max() <= 768 + traces.decision_stride + traces.draft_length
    assert np.isfinite(samples.gain).all()
    # an old working set gains more from a refresh than a young one
    assert samples.gain[samples.age < 64].mean() < samples.gain[samples.age >= 256].mean()
    fitted = ScorePolicy().fit(samples, threshold=0.25)
    assert fitted.threshold == 0.25
    median = ScorePolicy().fit(samples)
    scores = median.score_values(samples.signals)
    assert abs(np.mean(scores >= median.threshold) - 0.5) < 0.05
    with pytest.raises(ValueError):
        ScorePolicy().fit(samples, signals=["loss"])


def test_evaluate_policies(tmp_path: Path) -> None:
    traces = synthetic_traces(5, 512, seed=13)
    gate = controller_dict(families()[1])
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(gate))
    rows = evaluate_policies(traces, ["stat", "periodic:64", str(path), path, gate, "full"])
    assert [row["policy"] for row in rows] == [
        "stat",
        "periodic:64",
        "round-trip",
        "round-trip",
        "round-trip",
        "full",
    ]
    assert [row["kind"] for row in rows] == ["stat", "periodic", "gate", "gate", "gate", "full"]
    assert rows[2]["mean_al"] == rows[3]["mean_al"] == rows[4]["mean_al"]
    assert rows[-1]["al_vs_full"] == pytest.approx(1.0)
    assert rows[0]["refreshes"] == 0 and rows[1]["refreshes_per_1k"] > 0
    json.dumps(rows, allow_nan=False)
    with pytest.raises(ControllerError):
        evaluate_policies(traces, [tmp_path / "missing.json"])
    with pytest.raises(ValueError):
        evaluate_policies(traces, ["sometimes"])


def test_fidelity() -> None:
    traces = synthetic_traces(6, 400, seed=14)
    result = replay(traces, "periodic:64")
    closed = {
        "request_id": result.request_ids[::-1].tolist(),
        "committed": result.committed[::-1],
        "rounds": result.rounds[::-1],
        "refreshes": result.refreshes[::-1],
    }
    same = fidelity(result, closed)
    assert same["n_matched"] == 6 and same["al_gap"] == pytest.approx(0.0)
    assert same["refreshes_per_1k_gap"] == pytest.approx(0.0)
    assert same["per_request_al_mae"] == pytest.approx(0.0)
    rows = [
        {"request_id": rid, "committed": int(c), "rounds": int(r) + 10, "refreshes": int(f) + 1}
        for rid, c, r, f in zip(result.request_ids[:4], result.committed, result.rounds, result.refreshes, strict=False)
    ]
    rows.append({"request_id": "elsewhere", "committed": 10, "rounds": 5, "refreshes": 0})
    gap = fidelity(result, rows)
    assert gap["n_matched"] == 4 and gap["n_replay_only"] == 2 and gap["n_closed_only"] == 1
    assert gap["al_gap"] > 0 and gap["refreshes_per_1k_gap"] < 0
    with pytest.raises(ValueError):
        fidelity(result, {"request_id": ["a"]})


def test_render_controller() -> None:
    console = Console(record=True, width=120)
    for policy in families():
        console.print(render_controller(controller_dict(policy, calibration={"seed": 1})))
    text = console.export_text()
    for expected in (
        "ANY of",
        "ALL of",
        "acceptance <= 6",
        "query_drift >= 0.02",
        "refresh when age >= 48",
        "fires when score >= 0.8",
        "knots",
        "calibration",
        "seed: 1",
    ):
        assert expected in text
    with pytest.raises(ControllerError):
        render_controller({"format": "nope"})


def test_replay_many_handles_mixed_families_and_windows() -> None:
    traces = synthetic_traces(3, 300, seed=15)
    specs = [controller_dict(p) for p in families()]
    specs.append(controller_dict(families()[1], signals={"acceptance": {"rounds": 2}}))
    results = replay_many(traces, specs)
    for spec, result in zip(specs, results, strict=True):
        assert result.al.tolist() == replay(traces, spec).al.tolist()


def test_a_kind_or_its_tools_with_a_method_left_out_is_refused() -> None:
    """The interfaces are abstract: a kind missing its decision cannot be built, tools missing a method are
    abstract (policies/kinds.py refuses to register them), and an unsearched kind's suggest names itself."""
    import inspect

    from rift_ada.policies.kind_tools import KindTools
    from rift_ada.policies.periodic import PeriodicTools

    @dataclasses.dataclass(frozen=True)
    class NoDecision(PolicyKind):
        kind = "no-decision"

        @classmethod
        def from_json(cls, value, path="policy"):  # noqa: ANN001, ANN206
            return cls._checked()

        def to_json(self) -> dict[str, Any]:
            return {"kind": self.kind}

        def signals(self) -> frozenset[str]:
            return frozenset()

    with pytest.raises(TypeError, match="compile"):
        NoDecision()

    class NoRender(KindTools):
        kind = Periodic

        @staticmethod
        def skeleton(policy: Any) -> tuple:
            return ()

        @staticmethod
        def lanes(policies: Any, lanes_per_policy: int) -> Any:
            return None

    assert inspect.isabstract(NoRender) and NoRender.__abstractmethods__ == frozenset({"render"})
    assert not any(inspect.isabstract(tools) for tools in TOOLS.values())
    with pytest.raises(TypeError, match="'periodic' is not a family of the calibration search"):
        PeriodicTools.suggest(None, None)  # type: ignore[arg-type]
