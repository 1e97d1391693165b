"""The hindsight oracle against brute force on tiny traces, and against replay where they must agree."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.policies.oracle import captured_share, oracle_frontier, request_frontier
from rift_ada.policies.replay import replay


def _brute_force_rounds(acc: np.ndarray, stat: np.ndarray, k: int, stride: int, min_age: int, max_age: int) -> dict:
    """Every refresh decision sequence of a deterministic (0/1) walk: {refreshes: fewest rounds}."""
    n = stat.shape[0]
    best: dict[int, int] = {}

    def accepted_at(refresh_stride: int | None, q: int) -> bool:
        if refresh_stride is None:
            return bool(stat[q])
        return bool(acc[q // stride - refresh_stride, q])

    def walk(p: int, refresh_stride: int | None, refresh_origin: int, refreshes: int, rounds: int) -> None:
        if p >= n:
            best[refreshes] = min(best.get(refreshes, math.inf), rounds)
            return
        steps = min(k, n - p)
        accepted = 0
        while accepted < steps and accepted_at(refresh_stride, p + accepted):
            accepted += 1
        end = min(p + accepted + 1, n)
        options = [False]
        if end < n and end // stride > p // stride:
            age = end - refresh_origin
            if age >= max_age:
                options = [True]
            elif age >= min_age:
                options = [False, True]
        for refresh in options:
            if refresh:
                walk(end, end // stride, (end // stride) * stride, refreshes + 1, rounds + 1)
            else:
                walk(end, refresh_stride, refresh_origin, refreshes, rounds + 1)

    walk(0, None, 0, 0, 0)
    return best


def _expectimin(acc: np.ndarray, stat: np.ndarray, k: int, stride: int, min_age: int, max_age: int, budget: int):
    """Plain recursive expected-rounds minimum (no vectorisation) for fractional acceptance."""
    n = stat.shape[0]
    memo: dict = {}

    def prob(state: int | None, q: int) -> float:
        return float(stat[q]) if state is None else float(acc[q // stride - state, q])

    def solve(p: int, state: int | None, left: int) -> float:
        if p >= n:
            return 0.0
        key = (p, state, left)
        if key in memo:
            return memo[key]
        origin = 0 if state is None else state * stride
        steps = min(k, n - p)
        total, survive = 0.0, 1.0
        for accepted in range(steps + 1):
            p_len = survive * ((1.0 - prob(state, p + accepted)) if accepted < steps else 1.0)
            if accepted < steps:
                survive *= prob(state, p + accepted)
            if p_len == 0:
                continue
            end = min(p + accepted + 1, n)
            keep = solve(end, state, left)
            refresh = solve(end, end // stride, left - 1) if left > 0 else math.inf
            if end < n and end // stride > p // stride:
                age = end - origin
                after = refresh if age >= max_age else min(keep, refresh) if age >= min_age else keep
            else:
                after = keep
            total += p_len * after
        memo[key] = 1.0 + total
        return memo[key]

    return [solve(0, None, b) for b in range(budget + 1)]


def _tiny_traces(outcome_by_age: np.ndarray, stat: np.ndarray, stride: int, k: int, temperature: float) -> ProbeTraces:
    """Traces of one or more requests whose age arms sit on every multiple of ``stride``."""
    n_req, n_ages, n_pos = outcome_by_age.shape
    arms = ("stat", *(f"age:{g * stride}" for g in range(n_ages)))
    outcome = np.concatenate([stat[:, None, :], outcome_by_age], axis=1)
    requests = {
        "request_id": np.array([f"r{i}" for i in range(n_req)]),
        "dataset": np.array(["t"] * n_req),
        "category": np.array(["c"] * n_req),
        "tier": np.array(["low"] * n_req),
        "isl": np.full(n_req, 10),
        "osl": np.full(n_req, n_pos),
    }
    return ProbeTraces(
        requests=requests,
        arms=arms,
        outcome=outcome.astype(np.float64),
        entropy=np.ones_like(outcome, dtype=np.float64),
        stride_signals={},
        temperature=temperature,
        draft_length=k,
        decision_stride=stride,
    )


@pytest.mark.parametrize("seed", range(6))
def test_frontier_equals_brute_force_on_deterministic_walks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    stride, k, n = 4, 3, 28
    n_strides = -(-n // stride)
    # Staleness: fresher working sets match more often.
    match_rate = np.linspace(0.9, 0.3, n_strides)[:, None]
    acc = (rng.random((n_strides, n)) < match_rate).astype(float)
    stat = (rng.random(n) < 0.35).astype(float)
    min_age, max_age = 4, 16
    rounds = request_frontier(acc, stat, draft_length=k, stride=stride, min_age=min_age, max_age=max_age)
    exhaustive = _brute_force_rounds(acc, stat, k, stride, min_age, max_age)
    at_most = [min((r for c, r in exhaustive.items() if c <= b), default=math.inf) for b in range(len(rounds))]
    assert rounds.tolist() == pytest.approx(at_most)
    assert np.all(np.diff(rounds[np.isfinite(rounds)]) <= 1e-12)  # more refreshes never hurt


def test_frontier_equals_recursive_expectation_with_fractional_acceptance() -> None:
    rng = np.random.default_rng(7)
    stride, k, n = 3, 3, 16
    n_strides = -(-n // stride)
    acc = rng.uniform(0.2, 0.95, (n_strides, n))
    stat = rng.uniform(0.1, 0.6, n)
    rounds = request_frontier(acc, stat, draft_length=k, stride=stride, min_age=3, max_age=9, max_refreshes=4)
    reference = _expectimin(acc, stat, k, stride, 3, 9, 4)
    assert rounds.tolist() == pytest.approx(reference, rel=1e-12)


def test_no_refresh_oracle_is_the_stat_replay_at_t0() -> None:
    rng = np.random.default_rng(3)
    stride, k, n, n_req = 8, 11, 96, 3
    by_age = (rng.random((n_req, n // stride, n)) < 0.8).astype(float)
    stat = (rng.random((n_req, n)) < 0.6).astype(float)
    traces = _tiny_traces(by_age, stat, stride, k, 0.0)
    frontier = oracle_frontier(traces, min_age=0, max_age=10**6)
    stat_replay = replay(traces, "stat")
    assert frontier.mean_al[0] == pytest.approx(stat_replay.mean_al)
    # Refreshing can only help, and the oracle with a refresh budget beats periodic refresh at the same count.
    periodic = replay(traces, "periodic:32")
    total = int(periodic.refreshes.sum())
    assert frontier.mean_al[total] >= periodic.mean_al - 1e-9
    assert np.all(np.diff(frontier.mean_al) >= -1e-12)


def test_set_frontier_is_the_best_split_of_refreshes_across_requests() -> None:
    rng = np.random.default_rng(11)
    stride, k, n, n_req = 4, 3, 20, 3
    by_age = (rng.random((n_req, n // stride, n)) < 0.7).astype(float)
    stat = (rng.random((n_req, n)) < 0.3).astype(float)
    traces = _tiny_traces(by_age, stat, stride, k, 0.0)
    frontier = oracle_frontier(traces, min_age=4, max_age=10**6)
    per_request = [
        request_frontier(by_age[r], stat[r], draft_length=k, stride=stride, min_age=4, max_age=10**6) for r in range(3)
    ]
    for total in range(len(frontier.mean_al)):
        best = max(
            (
                sum(n / per_request[r][c] for r, c in enumerate(split)) / n_req
                for split in itertools.product(*(range(len(f)) for f in per_request))
                if sum(split) <= total
            ),
            default=-math.inf,
        )
        assert frontier.mean_al[total] == pytest.approx(best)


def test_captured_share() -> None:
    rng = np.random.default_rng(5)
    stride, k, n = 4, 3, 40
    by_age = np.stack([(rng.random((n // stride, n)) < np.linspace(0.95, 0.2, n // stride)[:, None]) for _ in range(2)])
    stat = (rng.random((2, n)) < 0.2).astype(float)
    frontier = oracle_frontier(_tiny_traces(by_age.astype(float), stat, stride, k, 0.0), min_age=4, max_age=10**6)
    al_ref = float(frontier.mean_al[6])
    oracle_rate = frontier.refreshes_for(al_ref)
    reference_rate = oracle_rate + 50.0
    assert captured_share(frontier, al_ref, reference_rate, reference_rate) == 0.0
    assert captured_share(frontier, al_ref, reference_rate, oracle_rate) == pytest.approx(1.0)
    assert captured_share(frontier, al_ref, reference_rate, oracle_rate + 25.0) == pytest.approx(0.5)
