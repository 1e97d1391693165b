"""BatchSessions == per-request Sessions stepped by hand; ControllerSet selection."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rift_ada
from rift_ada.batch import BatchSessions, ControllerSet
from rift_ada.conformance import random_controller_dict
from rift_ada.controller import Controller, make_controller_dict

GATE = {"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 4.0}]}


def _controller(temperature: float = 0.0, draft: str = "d", target: str = "t") -> Controller:
    return Controller.from_dict(
        make_controller_dict(GATE, name=f"c-{draft}-{temperature}", draft=draft, target=target, temperature=temperature)
    )


def test_exported_from_the_package() -> None:
    assert rift_ada.BatchSessions is BatchSessions and rift_ada.ControllerSet is ControllerSet


# One event: (request slot, kind, accepted, entropies, drift). Kinds: 0 = round, 1 = finish, 2 = recompute.
_event = st.tuples(
    st.integers(0, 5),
    st.sampled_from((0, 0, 0, 0, 0, 0, 1, 2)),
    st.integers(0, 11),
    st.lists(st.floats(0.0, 5.0, allow_nan=False), max_size=12),
    st.one_of(st.none(), st.floats(0.0, 0.5), st.just(math.nan)),
)


def _distinct_controllers(seeds: list[int]) -> list[Controller]:
    controllers = []
    for index, seed in enumerate(seeds):
        data = random_controller_dict(seed)
        data["draft"] = f"draft-{index}"  # one (draft, target, T) key per controller
        controllers.append(Controller.from_dict(data))
    return controllers


@settings(max_examples=60, deadline=None)
@given(
    seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=3),
    steps=st.lists(st.lists(_event, max_size=6), min_size=1, max_size=60),
)
def test_batch_equals_per_request_sessions(seeds: list[int], steps: list[list[tuple]]) -> None:
    """Random controllers, random batches with requests joining, finishing and being recomputed."""
    controllers = _distinct_controllers(seeds)
    batch = BatchSessions(ControllerSet(controllers))
    per_request: dict[str, rift_ada.Session] = {}
    offsets: dict[str, int] = {}
    committed: dict[str, int] = {}
    generation: dict[int, int] = {}

    def start(rid: str, slot: int, resume_at: int) -> None:
        controller = controllers[slot % len(controllers)]
        key = {"draft": controller.draft, "target": controller.target, "temperature": controller.temperature}
        batch.start(rid, resume_at=resume_at, **key)
        per_request[rid] = controller.new_session()
        offsets[rid] = resume_at

    for step in steps:
        ids, lens, ns, ents, drifts = [], [], [], [], []
        expected: list[str] = []
        for slot, kind, accepted, entropies, drift in step:
            rid = f"r{slot}.{generation.get(slot, 0)}"
            if rid in ids:  # one round per request per step
                continue
            if kind == 1 and rid in per_request:  # finished: the slot gets a new request
                assert batch.finish(rid) is not None
                del per_request[rid]
                generation[slot] = generation.get(slot, 0) + 1
                continue
            if kind == 2 and rid in per_request:  # preempted, draft KV recomputed: a fresh session resumes
                batch.finish(rid)
                start(rid, slot, committed[rid])
                continue
            if rid not in per_request:
                start(rid, slot, 0)
                committed[rid] = 0
            committed[rid] += accepted + 1
            ids.append(rid)
            lens.append(accepted + 1)
            ns.append(committed[rid])
            ents.append(entropies)
            drifts.append(drift)
            session = per_request[rid]
            session.record_round(accepted + 1, entropies)
            if drift is not None:
                session.record_query_drift(drift)
            if session.decide(committed[rid] - offsets[rid]):
                expected.append(rid)
        assert batch.step(ids, lens, ns, ents, drifts) == expected
    for rid, session in per_request.items():
        mine = batch.session(rid)
        assert mine.refresh_positions == session.refresh_positions
        assert mine.decisions == session.decisions
        assert mine.last_signals == session.last_signals


def test_step_validates_lengths_and_unknown_requests() -> None:
    batch = BatchSessions(_controller())
    batch.start("a")
    with pytest.raises(ValueError, match="accepted_lens 0"):
        batch.step(["a"], [], [1])
    with pytest.raises(KeyError, match="'b' has no session"):
        batch.step(["b"], [1], [1])
    with pytest.raises(ValueError, match="already has a session"):
        batch.start("a")


def test_recompute_counts_positions_from_the_resume_point() -> None:
    controller = _controller()
    batch = BatchSessions(controller)
    batch.start("a", resume_at=100)
    # 100 tokens were committed before the re-prefill: the first decision is at 108, age 8 < min_age 32.
    assert batch.step(["a"], [1], [108]) == []
    assert batch.session("a").decisions == 1
    assert batch.step(["a"], [1], [132]) == ["a"]  # age 32, acceptance 1 <= 4
    assert batch.session("a").refresh_positions == [32]


def test_controller_set_selects_by_draft_target_and_temperature() -> None:
    greedy, warm, hot = _controller(0.0), _controller(0.7), _controller(1.0)
    other = _controller(0.0, draft="other")
    controllers = ControllerSet([greedy, warm, hot, other])
    assert controllers.select("d", "t", 0.0) is greedy
    assert controllers.select("d", "t", 0.8) is warm
    assert controllers.select("d", "t", 0.95) is hot
    assert controllers.select("other", "t", 0.0) is other
    with pytest.raises(LookupError, match="temperature=0.01"):
        controllers.select("d", "t", 0.01)  # sampled requests never get the greedy controller
    with pytest.raises(LookupError, match="draft='x'"):
        controllers.select("x", "t", 0.0)
    with pytest.raises(ValueError, match="both serve"):
        ControllerSet([greedy, _controller(0.0)])


def test_mixed_temperatures_in_one_batch() -> None:
    batch = BatchSessions(ControllerSet([_controller(0.0), _controller(1.0)]))
    batch.start("greedy", draft="d", target="t", temperature=0.0)
    batch.start("sampled", draft="d", target="t", temperature=1.0)
    assert batch.session("greedy")._fires is not batch.session("sampled")._fires
    with pytest.raises(ValueError, match="needs draft, target and temperature"):
        batch.start("c")
    assert len(batch) == 2 and "greedy" in batch
    batch.finish("greedy")
    assert "greedy" not in batch and batch.finish("greedy") is None


def test_controller_set_load_names_a_bad_file(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(rift_ada.ControllerError, match="missing.json"):
        ControllerSet.load([missing])
    with pytest.raises(ValueError, match="tolerance"):
        ControllerSet([_controller()], tolerance=-1.0)
