"""The hindsight oracle: the fewest verification rounds reachable with n refreshes when the future is known.

A calibrated controller decides from past signals; the oracle decides knowing every position's
outcome under every working-set age. On the same probe traces, its frontier (best mean AL at each
refresh budget) bounds what any refresh controller with the same schedule can reach, so a report
can say what share of the oracle's refresh saving a controller captures at matched AL.

Model (the same round semantics as replay, docs/calibration.md "Oracle"):

* A request walks its fixed response round by round. A round starting at output position p drafts
  up to K positions; draft step i is accepted with probability ``a[p + i]`` (T = 0: the 0/1 match
  bit; T > 0: the probe's acceptance probability), the round ends at the first rejection and
  commits accepted + 1 tokens, cut at the OSL.
* The working set is the prefill selection (the ``stat`` arm) until the first refresh. A refresh at
  a decision point (after a round whose last committed token crosses a stride boundary, as
  ``rift_ada.Controller`` decides) makes positions in stride t read the arm of age
  ``stride * (t - s)``, s the refresh's stride; ages between probed arms are interpolated
  linearly, ages past the oldest arm read the oldest arm.
* ``min_age`` / ``max_age`` hold as in the controller; age at a decision is measured from the start
  of the refresh's stride (so it may exceed the controller's by < ``stride`` tokens).
* The oracle minimises the **expected** number of rounds (exact at T = 0 when every needed age is a
  probed arm, since the walk is then deterministic); it sees each round's realised end before
  deciding. A request's AL is OSL / expected rounds.

Per request, the exact frontier over refresh counts comes from one backward dynamic programme over
(round start, refresh stride, refreshes left); across requests, the set frontier (mean AL against
total refreshes) is an exact multiple-choice knapsack over the per-request frontiers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rift_ada.collectors.probe_traces import ARM_STAT, ProbeTraces

__all__ = ["OracleFrontier", "captured_share", "oracle_frontier", "request_frontier"]


@dataclass(frozen=True)
class OracleFrontier:
    """Best mean AL reachable with a total refresh budget, over a set of requests."""

    refreshes: np.ndarray  # (M,) total refreshes over the set, 0..M-1
    mean_al: np.ndarray  # (M,) best macro-mean AL with at most that many refreshes (nan: infeasible)
    committed: int  # output tokens over the set

    @property
    def refreshes_per_1k(self) -> np.ndarray:
        return self.refreshes * 1000.0 / max(1, self.committed)

    def refreshes_for(self, target_al: float) -> float:
        """Fewest refreshes per 1K tokens whose best mean AL reaches ``target_al`` (inf if none)."""
        reached = np.nonzero(np.nan_to_num(self.mean_al, nan=-np.inf) >= target_al - 1e-12)[0]
        return float(self.refreshes_per_1k[reached[0]]) if reached.size else float("inf")

    def to_dict(self) -> dict[str, list[float | None]]:
        return {
            "refreshes_per_1k": [float(x) for x in self.refreshes_per_1k],
            "mean_al": [None if np.isnan(x) else float(x) for x in self.mean_al],
        }


def _age_outcomes(traces: ProbeTraces, request: int, n_strides: int) -> np.ndarray:
    """(S, P) outcomes by working-set age in strides (0..S-1), interpolated between probed arms."""
    ages = traces.age_grid
    if ages.size == 0:
        raise ValueError("oracle: the traces have no age:N arms")
    rows = np.stack([traces.acceptance[request, traces.arm_index(f"age:{int(a)}")] for a in ages])
    wanted = np.arange(n_strides) * traces.decision_stride
    upper = np.clip(np.searchsorted(ages, wanted, side="left"), 0, ages.size - 1)
    lower = np.clip(upper - 1, 0, ages.size - 1)
    exact = ages[upper] == wanted
    lower = np.where(exact, upper, lower)
    span = np.where(upper > lower, ages[upper] - ages[lower], 1)
    weight = np.where(upper > lower, np.clip((wanted - ages[lower]) / span, 0.0, 1.0), 0.0)
    return (1.0 - weight)[:, None] * rows[lower] + weight[:, None] * rows[upper]


def request_frontier(
    acceptance: np.ndarray,
    stat_acceptance: np.ndarray,
    *,
    draft_length: int,
    stride: int,
    min_age: int,
    max_age: int,
    max_refreshes: int | None = None,
) -> np.ndarray:
    """Fewest expected rounds of one request with at most n refreshes, n = 0..N (inf: infeasible).

    ``acceptance[g, q]``: acceptance probability of output position q when the working set was
    refreshed g strides before q's stride; ``stat_acceptance[q]``: never refreshed (prefill selection).
    """
    n_positions = stat_acceptance.shape[0]
    n_strides = -(-n_positions // stride)
    if acceptance.shape[0] < n_strides:
        raise ValueError(f"acceptance: need {n_strides} age rows, got {acceptance.shape[0]}")
    if max_refreshes is None:
        max_refreshes = n_positions // max(stride, min_age, 1) + 1
    budget = max_refreshes + 1
    # State j: 0 = prefill selection, 1 + s = refreshed in stride s. acc[j, q] for reachable states.
    positions = np.arange(n_positions)
    acc = np.zeros((n_strides + 1, n_positions))
    acc[0] = stat_acceptance
    for s in range(n_strides):
        gap = positions // stride - s
        acc[1 + s] = np.where(gap >= 0, acceptance[np.clip(gap, 0, None), positions], 0.0)
    acc = np.nan_to_num(np.clip(acc, 0.0, 1.0))
    refresh_start = np.concatenate([[0], np.arange(n_strides) * stride])  # age origin of each state
    inf = np.inf
    value = np.full((n_positions + 1, n_strides + 1, budget), inf)
    value[n_positions] = 0.0
    for p in range(n_positions - 1, -1, -1):
        live = min(n_strides + 1, 2 + p // stride)  # states reachable at p: prefill, strides <= p's
        steps = min(draft_length, n_positions - p)
        probs = acc[:live, p : p + steps]  # (J, steps)
        survive = np.concatenate([np.ones((live, 1)), np.cumprod(probs, axis=1)], axis=1)
        stop = np.concatenate([1.0 - probs, np.ones((live, 1))], axis=1)
        p_len = (survive * stop).T  # (L, J): the round accepts exactly L drafts
        ends = np.minimum(p + np.arange(steps + 1) + 1, n_positions)  # (L,)
        after = _after_round(value, p, ends, refresh_start[:live], stride, min_age, max_age)  # (L, J, N+1)
        weight = np.broadcast_to(p_len[:, :, None], after.shape)
        expected = np.multiply(weight, after, out=np.zeros_like(after), where=weight > 0).sum(0)  # 0 * inf = 0
        value[p, :live] = 1.0 + expected
    return value[0, 0]


def _after_round(
    value: np.ndarray, start: int, ends: np.ndarray, refresh_start: np.ndarray, stride: int, min_age: int, max_age: int
) -> np.ndarray:
    """Expected further rounds (L, J, N+1) once a round from ``start`` committed up to each of ``ends``."""
    keep = value[ends, : refresh_start.size]  # (L, J, N+1)
    decision = (ends < value.shape[0] - 1) & (ends // stride > start // stride)  # (L,)
    if not decision.any():
        return keep
    refreshed = np.full_like(keep, np.inf)
    new_state = np.minimum(1 + ends // stride, value.shape[1] - 1)  # the end of the response: no decision
    refreshed[:, :, 1:] = value[ends, new_state, :-1][:, None, :]  # one refresh spent
    age = ends[:, None] - refresh_start[None, :]  # (L, J)
    may = (decision[:, None] & (age >= min_age))[:, :, None]
    must = (decision[:, None] & (age >= max_age))[:, :, None]
    return np.where(must, refreshed, np.where(may, np.minimum(keep, refreshed), keep))


def oracle_frontier(
    traces: ProbeTraces, *, min_age: int = 32, max_age: int = 768, requests: np.ndarray | None = None
) -> OracleFrontier:
    """The set frontier of the hindsight oracle over ``traces`` (all requests unless ``requests``)."""
    indices = np.arange(traces.n_requests) if requests is None else np.asarray(requests)
    stride = traces.decision_stride
    stat = traces.arm_index(ARM_STAT)
    per_request: list[np.ndarray] = []
    committed = 0
    for r in indices:
        osl = int(traces.osl[r])
        n_strides = -(-osl // stride)
        by_age = _age_outcomes(traces, int(r), n_strides)[:, :osl]
        rounds = request_frontier(
            by_age,
            traces.acceptance[r, stat, :osl],
            draft_length=traces.draft_length,
            stride=stride,
            min_age=min_age,
            max_age=max_age,
        )
        per_request.append(np.where(np.isfinite(rounds), osl / rounds, -np.inf))
        committed += osl
    best = np.zeros(1)
    for al in per_request:  # exact multiple-choice knapsack: best[k] = max sum of AL with k refreshes
        merged = np.full(best.size + al.size - 1, -np.inf)
        for n, gain in enumerate(al):
            merged[n : n + best.size] = np.maximum(merged[n : n + best.size], best + gain)
        best = np.maximum.accumulate(merged)  # "at most k"
    mean_al = np.where(np.isfinite(best), best / max(1, len(per_request)), np.nan)
    return OracleFrontier(np.arange(best.size), mean_al, committed)


def captured_share(
    frontier: OracleFrontier, reference_al: float, reference_refreshes_per_1k: float, controller_refreshes_per_1k: float
) -> float:
    """Share of the oracle's refresh saving (vs the reference at its AL) that a controller captures.

    1.0: the controller saves as many refreshes as the oracle; 0: none; nan if the oracle saves nothing.
    """
    oracle_saving = reference_refreshes_per_1k - frontier.refreshes_for(reference_al)
    if not np.isfinite(oracle_saving) or oracle_saving <= 0:
        return float("nan")
    return (reference_refreshes_per_1k - controller_refreshes_per_1k) / oracle_saving
