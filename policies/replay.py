"""Vectorised replay of refresh policies over probe traces, without a model.

Every request of the traces walks its fixed target response round by round. A round starting at
committed position n reads per-position outcomes of the probe arms:

* Arms by age: a working set of age a (tokens since the last refresh) lies between the probed
  ages g_j <= a < g_{j+1}. The round reads arm g_{j+1} with probability w = (a - g_j) / (g_{j+1} -
  g_j), else arm g_j, so the expected round outcome is interpolated linearly between the
  neighbouring arms (never rounded down to the younger arm). The choice is a fixed dither,
  frac(phi * (n + 1) + sqrt2 * (r + 1)) < w (r = request index), identical for every policy and
  run. Ages at or past the oldest arm read it; a policy that can reach ages beyond the probed
  range (its ``max_age``, or a periodic interval, below the longest response) is refused.
* T = 0: AL = 1 + number of leading matches in outcome[n : n + K], capped at K + 1 (exact).
* T > 0: each position's acceptance is sampled once per replica from the recorded acceptance
  probability given the response's token (``ProbeTraces.acceptance``: ``token_acceptance``, which
  makes the walk the free-running loop's law given the text; older traces: sum min(p, q)) (one
  seeded uniform per replica, request and position, shared by all arms and
  policies), and AL = 1 + leading accepted positions as at T = 0. Results are means over the
  replicas (``replicas``, default 4, ``seed`` recorded), with the spread of the mean AL.

The last round is cut at the request's OSL, so committed tokens always equal the OSL. After each
round the signals come from the one signal engine (:mod:`rift_ada.policies.signals`), fed as a
serving loop feeds :class:`rift_ada.Controller`: the round AL, the draft entropies of its
committed-conditioned positions (the accepted drafts and the first rejected one: min(AL, K)
positions from n under the arm used) and the query drift of the stride holding the last committed
position. All lanes (requests x replicas x policies) step in lockstep as numpy arrays. Decisions are
those of a ``Controller`` session stepped by hand with the same rounds (tests/test_replay.py).
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rift_ada import policy_kinds
from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT, ProbeTraces, arm_age
from rift_ada.controller import SIGNAL_NAMES, Controller, validate_controller_dict
from rift_ada.policies.kinds import tools_of
from rift_ada.policies.signals import SignalEngine
from rift_ada.policy_kinds import PolicyKind
from rift_ada.policy_spec import parse

__all__ = [
    "DEFAULT_REPLICAS",
    "NAMED_POLICIES",
    "DecisionPoints",
    "ReplayResult",
    "decision_points",
    "named_policy_controller",
    "replay",
    "replay_many",
]

NAMED_POLICIES = ("stat", "full", "periodic:N", "dyn:N")
DEFAULT_REPLICAS = 4  # sampling replicas at T > 0 (T = 0 replay is exact: one replica)
PolicySpec = dict[str, Any] | str | Controller
_PHI = 0.6180339887498949  # dither steps (golden ratio and sqrt(2), fractional parts)
_SQRT2 = 0.41421356237309515


@dataclass
class ReplayResult:
    """Per-request outcome of one policy replayed over probe traces (means over the replicas)."""

    request_ids: np.ndarray
    committed: np.ndarray  # (R,) tokens committed (= OSL)
    rounds: np.ndarray  # (R,) verification rounds (mean over replicas)
    refreshes: np.ndarray  # (R,) working-set refreshes after the prefill (mean over replicas)
    al: np.ndarray  # (R,) committed / rounds (mean over replicas)
    position_edges: np.ndarray  # (n_bins + 1,) output-position bin edges
    al_by_position: np.ndarray  # (R, n_bins) AL of rounds starting in each bin, NaN if none
    policy: str = ""
    refresh_positions: list[np.ndarray] | None = field(default=None, repr=False)  # replica 0
    replicas: int = 1
    seed: int | None = None  # sampling seed at T > 0 (None: exact T = 0 replay)
    replica_mean_al: np.ndarray | None = None  # (replicas,) macro mean AL of each replica

    @property
    def mean_al(self) -> float:
        """Macro mean AL over requests (as NVIDIA's specdec_bench)."""
        return float(np.mean(self.al)) if len(self.al) else math.nan

    @property
    def mean_al_std(self) -> float:
        """Standard deviation of the mean AL over the sampling replicas (0 with one replica)."""
        if self.replica_mean_al is None or len(self.replica_mean_al) < 2:
            return 0.0
        return float(np.std(self.replica_mean_al, ddof=1))

    @property
    def refreshes_per_1k(self) -> float:
        """Refreshes per 1,000 committed tokens over all requests."""
        committed = float(np.sum(self.committed))
        return 1000.0 * float(np.sum(self.refreshes)) / committed if committed else math.nan

    def to_dict(self, per_request: bool = False) -> dict[str, Any]:
        """JSON-able summary (NaN written as null); ``per_request`` adds the per-request arrays."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # bins that no request reaches
            mean_by_position = np.nanmean(self.al_by_position, axis=0) if len(self.al) else np.array([])
        summary: dict[str, Any] = {
            "policy": self.policy,
            "n_requests": len(self.request_ids),
            "mean_al": _finite_or_none(self.mean_al),
            "refreshes_per_1k": _finite_or_none(self.refreshes_per_1k),
            "committed": int(np.sum(self.committed)),
            "rounds": _count(np.sum(self.rounds)),
            "refreshes": _count(np.sum(self.refreshes)),
            "replicas": self.replicas,
            "seed": self.seed,
            "mean_al_std": self.mean_al_std,
            "al_by_position": {
                "edges": [int(x) for x in self.position_edges],
                "mean_al": [_finite_or_none(x) for x in mean_by_position],
            },
        }
        if per_request:
            summary["per_request"] = {
                "request_id": [str(x) for x in self.request_ids],
                "committed": [int(x) for x in self.committed],
                "rounds": [_count(x) for x in self.rounds],
                "refreshes": [_count(x) for x in self.refreshes],
                "al": [_finite_or_none(x) for x in self.al],
            }
        return summary


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _count(value: Any) -> int | float:
    """An integer count as int; a mean over replicas as float."""
    value = float(value)
    return int(value) if value.is_integer() else value


# ----------------------------------------------------------------------------------------------
# Policy specs


def named_policy_controller(name: str) -> dict[str, Any] | None:
    """Controller dict for ``periodic:N`` / ``dyn:N``; None for ``stat`` / ``full``; ValueError otherwise.

    The spec is read by :func:`rift_ada.policy_spec.parse`; a periodic one's ages come from
    :meth:`~rift_ada.policy_spec.PolicySpec.schedule` (``min_age`` 0, ``max_age`` max(768, N)).
    """
    spec = parse(name)
    if spec.kind in (ARM_STAT, ARM_FULL):
        return None
    if spec.is_periodic:
        return spec.controller(draft="replay", target="replay", temperature=0.0)
    raise ValueError(f"policy {name!r} is not a named replay policy: expected one of {', '.join(NAMED_POLICIES)}")


@dataclass
class _Plan:
    label: str
    arm_mode: str  # "age", "stat" or "full"
    controller: dict[str, Any] | None
    kind: PolicyKind | None = field(init=False)  # the controller's policy as its kind object

    def __post_init__(self) -> None:
        self.kind = None if self.controller is None else policy_kinds.from_json(self.controller["policy"])


def _plan(policy: PolicySpec) -> _Plan:
    if isinstance(policy, Controller):
        return _Plan(policy.name, "age", policy.to_dict())
    if isinstance(policy, str):
        controller = named_policy_controller(policy)
        label = parse(policy).label
        return _Plan(label, label if controller is None else "age", controller)
    if isinstance(policy, dict):
        data = validate_controller_dict(policy)
        return _Plan(data["name"], "age", data)
    raise TypeError(f"policy must be a controller dict, a Controller or a name, got {type(policy).__name__}")


def _oldest_age_needed(plan: _Plan) -> int:
    """The oldest working-set age a controller can hold before its forced refresh."""
    assert plan.controller is not None and plan.kind is not None
    return tools_of(plan.kind).oldest_age(plan.kind, plan.controller["schedule"])


def _check_age_range(traces: ProbeTraces, plan: _Plan) -> None:
    """Refuse a policy that would read working-set ages beyond the probed arms (naming the range)."""
    if plan.controller is None:
        return
    grid = traces.age_grid
    if len(grid) == 0:
        raise ValueError("traces have no age:N arms; only 'stat' and 'full' can be replayed")
    longest = int(np.max(traces.osl)) if traces.n_requests else 0
    needed = min(_oldest_age_needed(plan), max(longest - 1, 0))
    if needed > int(grid[-1]):
        raise ValueError(
            f"policy {plan.label!r} can reach working-set ages up to {needed} tokens, but the probe arms "
            f"cover ages {int(grid[0])}..{int(grid[-1])} only; collect probe traces with arms up to "
            f"{needed} (collect --arm-ages) or lower schedule.max_age to {int(grid[-1])}"
        )


# ----------------------------------------------------------------------------------------------
# Policy-independent tables, built once per traces object (and sampling setting) and cached.


@dataclass
class _Tables:
    accepted: np.ndarray  # (V * R * A * W,) int8 (int16 for K >= 127): AL of a round starting at n (V replicas)
    entropy: np.ndarray  # (V * R * A * W,): entropy sum over that round's min(AL, K) first positions
    drift: np.ndarray | None  # (V * R * A * W,) as recorded: drift of the stride holding position m - 1 (index m)
    dither: np.ndarray  # (R * W,): arm-mix dither of a round starting at n
    width: int  # W = P + 1
    n_arms: int
    replicas: int
    seed: int | None
    osl: np.ndarray
    draft_length: int
    arm_ages: dict[str, int | None]
    arm_index: dict[str, int]
    n_positions: int


def _sampled_matches(traces: ProbeTraces, replicas: int, seed: int | None) -> np.ndarray:
    """(V, R, A, P) accepted flags: the match bit at T = 0, one seeded sample per replica at T > 0
    (of ``traces.acceptance``: the acceptance probability given the text's token where recorded)."""
    n_req, _, n_pos = traces.outcome.shape
    valid = (np.arange(n_pos)[None, :] < traces.osl[:, None])[:, None, :]
    if seed is None:
        return ((traces.outcome > 0.5) & valid)[None]
    probability = np.nan_to_num(traces.acceptance.astype(np.float64), nan=0.0)
    uniforms = np.random.default_rng(seed).random((replicas, n_req, n_pos))
    return (uniforms[:, :, None, :] < probability[None]) & valid[None]


def _build_tables(traces: ProbeTraces, replicas: int, seed: int | None) -> _Tables:
    n_req, n_arms, n_pos = traces.outcome.shape
    width = n_pos + 1
    k = traces.draft_length
    osl = traces.osl
    if np.any(osl > n_pos) or np.any(osl < 0):
        raise ValueError("probe traces: an OSL exceeds the number of positions")
    if k >= np.iinfo(np.int16).max:
        raise ValueError(f"draft_length {k} is too large for replay")
    positions = np.arange(width)
    remaining = np.clip(osl[:, None, None] - positions[None, None, :], 0, None)  # (R, 1, W)
    match = _sampled_matches(traces, replicas, seed).reshape(-1, n_arms, n_pos)
    marks = np.where(match, n_pos, np.arange(n_pos, dtype=np.int64))
    next_miss = np.minimum.accumulate(marks[:, :, ::-1], axis=2)[:, :, ::-1]
    run = np.concatenate([next_miss - np.arange(n_pos), np.zeros(match.shape[:2] + (1,), np.int64)], axis=2)
    run = run.reshape(replicas, n_req, n_arms, width)
    accepted_len = np.minimum(1 + np.minimum(run, k), remaining[None]).astype(np.float64)
    count = np.minimum(accepted_len, k)  # committed-conditioned draft positions of the round
    valid = positions[None, None, :n_pos] < osl[:, None, None]
    entropy = np.where(valid, traces.entropy.astype(np.float64), 0.0)
    entropy = np.concatenate([entropy, np.zeros((n_req, n_arms, k))], axis=2)
    entropy_sum = np.zeros(accepted_len.shape)
    for j in range(k):  # same order of additions as Session.record_round
        entropy_sum = entropy_sum + np.where(j < count, entropy[None, :, :, j : j + width], 0.0)
    drift_table = None
    if "query_drift" in traces.stride_signals:
        drift = traces.stride_signals["query_drift"]  # float32 as recorded: exact in float64, half the bytes
        drift = drift.astype(np.float32 if drift.dtype in (np.float16, np.float32) else np.float64)
        stride_of_last = np.clip((positions - 1) // traces.decision_stride, 0, drift.shape[2] - 1)
        table = drift[:, :, stride_of_last]
        table[:, :, 0] = np.nan
        # laid out as `accepted` (one copy per replica), so a round's drift is read at its row + AL
        drift_table = np.broadcast_to(table, (replicas, *table.shape)).reshape(-1)
    al_dtype = np.int8 if k < np.iinfo(np.int8).max else np.int16
    request = np.arange(n_req, dtype=np.float64)[:, None]
    dither = np.modf(_PHI * (positions[None, :] + 1.0) + _SQRT2 * (request + 1.0))[0]
    return _Tables(
        accepted=accepted_len.astype(al_dtype).reshape(-1),  # small: the walk reads it at random
        entropy=entropy_sum.reshape(-1),
        drift=drift_table,
        dither=dither.reshape(-1),
        width=width,
        n_arms=n_arms,
        replicas=replicas,
        seed=seed,
        osl=osl,
        draft_length=k,
        arm_ages={name: arm_age(name) for name in traces.arms},
        arm_index={name: i for i, name in enumerate(traces.arms)},
        n_positions=n_pos,
    )


_TABLE_CACHE: dict[int, tuple[weakref.ref, tuple, _Tables]] = {}
_TABLE_CACHE_SIZE = 4  # traces objects whose tables stay cached (splits of one calibration run)


def _sampling(traces: ProbeTraces, replicas: int | None, seed: int) -> tuple[int, int | None]:
    """(replicas, seed) actually used: T = 0 is exact (1 replica, no seed)."""
    if traces.temperature <= 0:
        return 1, None
    count = DEFAULT_REPLICAS if replicas is None else int(replicas)
    if count < 1:
        raise ValueError(f"replicas must be >= 1, got {count}")
    return count, int(seed)


def _tables(traces: ProbeTraces, replicas: int | None = None, seed: int = 0) -> _Tables:
    """Replay tables of ``traces``, cached while the traces object lives and its arrays are the same.

    The cache is module-level (not an attribute), so pickling traces for worker processes stays cheap.
    """
    replicas, used_seed = _sampling(traces, replicas, seed)
    arrays = (traces.acceptance, traces.entropy, traces.stride_signals.get("query_drift"))
    settings = (traces.draft_length, traces.decision_stride, traces.temperature > 0, tuple(traces.arms))
    settings += (replicas, used_seed)
    entry = _TABLE_CACHE.get(id(traces))
    if entry is not None:
        ref, (cached_arrays, cached_settings), tables = entry
        same_arrays = all(a is b for a, b in zip(cached_arrays, arrays, strict=True))
        if ref() is traces and same_arrays and cached_settings == settings:
            return tables
    tables = _build_tables(traces, replicas, used_seed)
    if id(traces) not in _TABLE_CACHE:
        weakref.finalize(traces, _TABLE_CACHE.pop, id(traces), None)
    _TABLE_CACHE[id(traces)] = (weakref.ref(traces), (arrays, settings), tables)
    while len(_TABLE_CACHE) > _TABLE_CACHE_SIZE:
        del _TABLE_CACHE[next(iter(_TABLE_CACHE))]
    return tables


@dataclass
class _AgeArms:
    """Per working-set age 0 .. P: row offsets (arm * W) of the younger and older neighbouring arm."""

    younger: np.ndarray
    older: np.ndarray
    weight: np.ndarray  # probability of reading the older arm (0 on a probed age)
    interpolates: bool


def _age_arms(tables: _Tables, arm_mode: str) -> _AgeArms:
    ages = np.arange(tables.width)
    if arm_mode in (ARM_STAT, ARM_FULL):
        if arm_mode not in tables.arm_index:
            raise ValueError(f"traces have no {arm_mode!r} arm")
        fixed = np.full(tables.width, tables.arm_index[arm_mode] * tables.width, dtype=np.int64)
        return _AgeArms(fixed, fixed, np.zeros(tables.width), False)
    grid = sorted((age, tables.arm_index[name]) for name, age in tables.arm_ages.items() if age is not None)
    if not grid:
        raise ValueError("traces have no age:N arms; only 'stat' and 'full' can be replayed")
    grid_ages = np.array([age for age, _ in grid], dtype=np.float64)
    grid_arms = np.array([arm for _, arm in grid], dtype=np.int64)
    lower = np.clip(np.searchsorted(grid_ages, ages, side="right") - 1, 0, len(grid) - 1)
    upper = np.minimum(lower + 1, len(grid) - 1)
    inside = (ages >= grid_ages[0]) & (ages < grid_ages[-1])
    span = np.maximum(grid_ages[upper] - grid_ages[lower], 1.0)
    weight = np.where(inside, (ages - grid_ages[lower]) / span, 0.0)
    upper = np.where(inside, upper, lower)
    return _AgeArms(
        younger=grid_arms[lower] * tables.width,
        older=grid_arms[upper] * tables.width,
        weight=weight,
        interpolates=bool(np.any(weight > 0)),
    )


# ----------------------------------------------------------------------------------------------
# Vectorised policy evaluation: each kind's lanes (rift_ada.policies.kinds) get the signal arrays
# of all lanes, the ages and their lane slice, and return the "policy fires" flags of their lanes.


def _skeleton(plan: _Plan) -> tuple:
    """Structure of a plan's policy without its numbers: policies sharing it evaluate together."""
    assert plan.kind is not None
    return tools_of(plan.kind).skeleton(plan.kind)


def _lane_values(values: Sequence[float], n_requests: int) -> np.ndarray | float:
    """Per-lane array of a per-policy number (a scalar when all policies share it)."""
    if all(v == values[0] for v in values):
        return float(values[0])
    return np.repeat(np.asarray(values, dtype=np.float64), n_requests)


def _group_evaluators(plans: list[_Plan], n_requests: int) -> list[list[Any]]:
    """[lanes, first lane, end lane] per run of policies sharing a skeleton (pre-sorted by skeleton)."""
    groups: list[tuple[tuple, int, int]] = []
    for index, plan in enumerate(plans):
        skeleton = _skeleton(plan)
        if groups and groups[-1][0] == skeleton:
            groups[-1] = (skeleton, groups[-1][1], index + 1)
        else:
            groups.append((skeleton, index, index + 1))
    evaluators = []
    for _, start, stop in groups:
        members = [plan.kind for plan in plans[start:stop]]
        lanes = tools_of(members[0]).lanes(members, n_requests)
        evaluators.append([lanes, start * n_requests, stop * n_requests])
    return evaluators


# ----------------------------------------------------------------------------------------------
# The lockstep engine.


@dataclass
class _LaneOutput:
    # Per compaction segment: (lane ids (m,), round starts (k, m)), k lockstep iterations.
    segments: list[tuple[np.ndarray, np.ndarray]]
    final: np.ndarray  # (L,) final position
    refreshes: np.ndarray  # (L,)
    refresh_events: list[tuple[np.ndarray, np.ndarray]] | None


# observer(lane ids, n_committed, age, signals) of the lanes deciding now (before any refresh)
Observer = Callable[[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]], None]
_COMPACT_EVERY = 16  # iterations between checks for finished lanes
_COMPACT_BELOW = 0.75  # drop finished lanes once fewer than this share of the lanes is active


class _LaneState:
    """Per-lane arrays of the lockstep loop (a float or int where all lanes share the value)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the lanes where ``mask`` is False."""
        for key, value in list(vars(self).items()):
            if isinstance(value, np.ndarray) and value.shape[:1] == mask.shape:
                setattr(self, key, value[mask])


def _run_lanes(
    tables: _Tables,
    plans: list[_Plan],
    arm_mode: str,
    record_refreshes: bool,
    observer: Observer | None = None,
) -> _LaneOutput:
    n_req = len(tables.osl)
    per_policy = tables.replicas * n_req  # lanes of one policy: replica-major, then request
    n_lanes = len(plans) * per_policy
    lane_slot = np.tile(np.arange(per_policy), len(plans))  # replica * R + request
    lane_req = lane_slot % n_req
    s = _LaneState(
        ids=np.arange(n_lanes),  # original lane of each slot (slots shrink as lanes finish)
        base=lane_slot * (tables.n_arms * tables.width),
        dither_base=lane_req * tables.width,
        osl=tables.osl[lane_req],
        n=np.zeros(n_lanes, dtype=np.int64),
        refreshes=np.zeros(n_lanes, dtype=np.int64),
        last_refresh=np.zeros(n_lanes, dtype=np.int64),
    )
    arms = _age_arms(tables, arm_mode)
    deciding = arm_mode == "age"
    events: list[tuple[np.ndarray, np.ndarray]] | None = [] if record_refreshes else None
    evaluators: list[list[Any]] = []
    engine: SignalEngine | None = None
    need_entropy = need_drift = False
    if deciding:
        controllers = [plan.controller for plan in plans]
        assert all(c is not None for c in controllers)
        s.__dict__.update(
            stride=_int_lanes([c["schedule"]["decision_stride"] for c in controllers], per_policy),
            min_age=_int_lanes([c["schedule"]["min_age"] for c in controllers], per_policy),
            max_age=_int_lanes([c["schedule"]["max_age"] for c in controllers], per_policy),
            stride_index=np.zeros(n_lanes, dtype=np.int64),
        )
        used: set[str] = set(SIGNAL_NAMES) if observer is not None else set()
        used = used.union(*(plan.kind.signals() for plan in plans))
        engine = SignalEngine(
            n_lanes,
            alpha=_lane_values([c["signals"]["acceptance"]["ewma_alpha"] for c in controllers], per_policy),
            rounds=controllers[0]["signals"]["acceptance"]["rounds"],
            need=used,
            max_accepted=tables.draft_length + 1,
        )
        evaluators = _group_evaluators(plans, per_policy)
        need_entropy = engine.need_entropy
        need_drift = engine.need_drift and tables.drift is not None

    final = np.zeros(n_lanes)
    refreshes_out = np.zeros(n_lanes, dtype=np.int64)
    segments: list[tuple[np.ndarray, np.ndarray]] = []
    starts: list[np.ndarray] = []
    iteration = 0
    with np.errstate(invalid="ignore", divide="ignore"):
        while True:
            n = s.n
            starts.append(n)
            age = n - s.last_refresh
            arm = arms.younger.take(age)
            if arms.interpolates:
                mix = tables.dither.take(s.dither_base + n) < arms.weight.take(age)
                arm = np.where(mix, arms.older.take(age), arm)
            row = s.base + arm + n
            step = tables.accepted.take(row)
            n_new = n + step
            s.n = n_new
            if engine is not None:
                if need_entropy:
                    engine.record_round(step, tables.entropy.take(row), np.minimum(step, tables.draft_length))
                else:
                    engine.record_round(step)
                new_stride_index = n_new // s.stride
                decision = new_stride_index > s.stride_index
                s.stride_index = new_stride_index
                if np.count_nonzero(decision):
                    age = age + step
                    drift = tables.drift.take(row + step).astype(np.float64) if need_drift else None
                    signals = engine.decide(decision, drift)
                    if observer is not None:
                        where = np.flatnonzero(decision)
                        observer(s.ids[where], n_new[where], age[where], {k_: v[where] for k_, v in signals.items()})
                    if len(evaluators) == 1:
                        fires = evaluators[0][0].fires(signals, age, slice(0, len(n)))
                    else:
                        fires = np.empty(len(n), dtype=bool)
                        for evaluator, first, end in evaluators:
                            fires[first:end] = evaluator.fires(signals, age, slice(first, end))
                    refresh = fires & (age >= s.min_age)
                    refresh |= age >= s.max_age
                    refresh &= decision
                    np.putmask(s.last_refresh, refresh, n_new)
                    s.refreshes += refresh
                    engine.refreshed(refresh)
                    if events is not None:
                        refreshed = np.flatnonzero(refresh)
                        events.append((s.ids[refreshed], n_new[refreshed]))
            iteration += 1
            if iteration % _COMPACT_EVERY:
                continue
            active = s.n < s.osl
            n_active = np.count_nonzero(active)
            if n_active > _COMPACT_BELOW * len(active):
                continue
            # Record the totals of finished lanes, then drop them from every per-lane array.
            finished = ~active
            final[s.ids[finished]] = s.n[finished]
            refreshes_out[s.ids[finished]] = s.refreshes[finished]
            if starts:
                segments.append((s.ids, np.stack(starts)))
            starts = []
            if n_active == 0:
                break
            s.keep(active)
            if engine is not None:
                engine.keep(active)
            bounds = np.concatenate([[0], np.cumsum(active)])
            for group in evaluators:
                group[0].keep(active[group[1] : group[2]])
                group[1], group[2] = int(bounds[group[1]]), int(bounds[group[2]])
    return _LaneOutput(segments=segments, final=final, refreshes=refreshes_out, refresh_events=events)


def _int_lanes(values: Sequence[int], n_requests: int) -> np.ndarray | int:
    if all(v == values[0] for v in values):
        return int(values[0])
    return np.repeat(np.asarray(values, dtype=np.int64), n_requests)


# ----------------------------------------------------------------------------------------------
# Public entry points.


def _batches(plans: list[_Plan]) -> dict[tuple, list[int]]:
    """Plans that can share one lockstep run (same arm mode and acceptance window)."""
    batches: dict[tuple, list[int]] = {}
    for index, plan in enumerate(plans):
        if plan.controller is None:
            key: tuple = (plan.arm_mode,)
        else:
            key = ("age", plan.controller["signals"]["acceptance"]["rounds"])
        batches.setdefault(key, []).append(index)
    return batches


def replay_many(
    traces: ProbeTraces,
    policies: Sequence[PolicySpec],
    *,
    position_bin: int = 256,
    record_refreshes: bool = False,
    replicas: int | None = None,
    seed: int = 0,
) -> list[ReplayResult]:
    """Replay several policies at once (one lane per policy, replica and request); results in input order.

    ``replicas`` / ``seed``: sampling replicas at T > 0 (default :data:`DEFAULT_REPLICAS`, seed 0);
    T = 0 replay is exact and ignores both. Policies sharing the acceptance window
    (``signals.acceptance.rounds``) run in the same lockstep loop. A policy that can reach
    working-set ages beyond the probed arms is refused (ValueError naming the range).
    """
    if position_bin < 1:
        raise ValueError("position_bin must be >= 1")
    plans = [_plan(policy) for policy in policies]
    for plan in plans:
        _check_age_range(traces, plan)
    tables = _tables(traces, replicas, seed)
    results: list[ReplayResult | None] = [None] * len(plans)
    for (arm_mode, *_), indices in _batches(plans).items():
        if arm_mode == "age":
            indices = sorted(indices, key=lambda i: repr(_skeleton(plans[i])))
        batch = [plans[i] for i in indices]
        output = _run_lanes(tables, batch, arm_mode, record_refreshes)
        labels = [plan.label for plan in batch]
        for index, result in zip(indices, _results(traces, tables, output, labels, position_bin), strict=True):
            results[index] = result
    return [result for result in results if result is not None]


def replay(
    traces: ProbeTraces,
    policy: PolicySpec,
    *,
    position_bin: int = 256,
    record_refreshes: bool = False,
    replicas: int | None = None,
    seed: int = 0,
) -> ReplayResult:
    """Replay one policy: a controller dict, a Controller, or ``stat``/``full``/``periodic:N``/``dyn:N``."""
    return replay_many(
        traces, [policy], position_bin=position_bin, record_refreshes=record_refreshes, replicas=replicas, seed=seed
    )[0]


@dataclass
class DecisionPoints:
    """Signals at every decision of some replayed walks (one row per lane decision)."""

    signals: dict[str, np.ndarray]  # name -> (N,), NaN where missing
    request: np.ndarray  # (N,) request index in the traces
    position: np.ndarray  # (N,) committed tokens at the decision
    age: np.ndarray  # (N,) working-set age at the decision (before a refresh it triggers)
    replica: np.ndarray  # (N,) sampling replica

    def __len__(self) -> int:
        return len(self.request)


def decision_points(
    traces: ProbeTraces,
    policies: Sequence[PolicySpec],
    *,
    replicas: int | None = None,
    seed: int = 0,
) -> DecisionPoints:
    """Every signal at every decision point of ``policies`` walked over ``traces`` (the grids' and
    the score fit's view of the signals: the same engine and rounds as replay)."""
    plans = [_plan(policy) for policy in policies]
    if any(plan.controller is None for plan in plans):
        raise ValueError("decision points need deciding policies (controller dicts or periodic:N)")
    for plan in plans:
        _check_age_range(traces, plan)
    tables = _tables(traces, replicas, seed)
    n_req = len(tables.osl)
    parts: dict[str, list[np.ndarray]] = {"ids": [], "position": [], "age": []}
    signal_parts: dict[str, list[np.ndarray]] = {name: [] for name in SIGNAL_NAMES}

    def observe(ids: np.ndarray, position: np.ndarray, age: np.ndarray, signals: dict[str, np.ndarray]) -> None:
        parts["ids"].append(ids)
        parts["position"].append(position)
        parts["age"].append(age)
        for name in SIGNAL_NAMES:
            signal_parts[name].append(np.asarray(signals[name], dtype=np.float64))

    for _, indices in _batches(plans).items():
        _run_lanes(tables, [plans[i] for i in indices], "age", False, observe)
    ids = np.concatenate(parts["ids"]) if parts["ids"] else np.zeros(0, np.int64)
    slot = ids % (tables.replicas * n_req)
    return DecisionPoints(
        signals={name: np.concatenate(chunks) if chunks else np.zeros(0) for name, chunks in signal_parts.items()},
        request=slot % n_req,
        position=np.concatenate(parts["position"]) if parts["position"] else np.zeros(0, np.int64),
        age=np.concatenate(parts["age"]) if parts["age"] else np.zeros(0, np.int64),
        replica=slot // n_req,
    )


def _results(
    traces: ProbeTraces, tables: _Tables, output: _LaneOutput, labels: list[str], position_bin: int
) -> list[ReplayResult]:
    """Per-policy results from the lanes of one lockstep run (lanes: policy, replica, request)."""
    n_req = len(tables.osl)
    reps = tables.replicas
    per_policy = reps * n_req
    n_lanes = len(labels) * per_policy
    osl = np.tile(tables.osl, len(labels) * reps).astype(np.int64)
    n_bins = max(1, -(-tables.n_positions // position_bin))
    edges = np.arange(n_bins + 1, dtype=np.int64) * position_bin
    rounds, sums, counts = _rounds_by_position(output, np.minimum(edges[None, :], osl[:, None]))
    committed = np.rint(output.final).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        al = committed / rounds
        al_by_position = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).reshape(n_lanes, n_bins)
    positions_by_lane: list[np.ndarray] | None = None
    if output.refresh_events is not None:
        lanes = np.concatenate([lanes for lanes, _ in output.refresh_events] or [np.zeros(0, np.int64)])
        where = np.concatenate([where for _, where in output.refresh_events] or [np.zeros(0, np.int64)])
        order = np.argsort(lanes, kind="stable")
        split = np.searchsorted(lanes[order], np.arange(1, n_lanes))
        positions_by_lane = [p.astype(np.int64) for p in np.split(where[order], split)]
    if reps > 1:  # per policy and request: mean over the replicas of the bins they reach
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            al_by_position = np.nanmean(al_by_position.reshape(len(labels), reps, n_req, n_bins), axis=1)
    al_by_position = al_by_position.reshape(len(labels) * n_req, n_bins)
    results = []
    for slot, label in enumerate(labels):
        lanes_of = slice(slot * per_policy, (slot + 1) * per_policy)
        by_replica = (reps, n_req)
        al_rep = al[lanes_of].reshape(by_replica)
        by_position = al_by_position[slot * n_req : (slot + 1) * n_req]
        results.append(
            ReplayResult(
                request_ids=np.asarray(traces.requests["request_id"]),
                committed=committed[lanes_of][:n_req],
                rounds=_replica_mean(rounds[lanes_of].reshape(by_replica)),
                refreshes=_replica_mean(output.refreshes[lanes_of].reshape(by_replica)),
                al=al_rep.mean(axis=0),
                position_edges=edges,
                al_by_position=by_position,
                policy=label,
                refresh_positions=None if positions_by_lane is None else positions_by_lane[lanes_of][:n_req],
                replicas=reps,
                seed=tables.seed,
                replica_mean_al=al_rep.mean(axis=1) if n_req else np.full(reps, np.nan),
            )
        )
    return results


def _rounds_by_position(output: _LaneOutput, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds (L,), committed tokens (L, B), rounds (L, B)) of the rounds each lane started in each
    position bin, ``edges`` (L, B + 1) the bins' bounds cut at the lane's OSL.

    A lane's round starts increase and each round ends where the next starts (the last at the
    lane's final position), so the rounds starting in [a, b) commit G(b) - G(a) tokens, G(x) being
    the first start at or after x (else the final position), and number I(b) - I(a), I(x) being the
    count of starts before x. Both come from one ``searchsorted`` per segment of the walk, whose
    columns (lanes) are laid end to end with offsets so that the flattened starts are sorted.
    """
    n_lanes, n_edges = edges.shape
    below = np.zeros((n_lanes, n_edges), dtype=np.int64)  # I(edge)
    first_at = np.broadcast_to(output.final.astype(np.int64)[:, None], edges.shape).copy()  # G(edge)
    spread = int(max(edges.max(initial=0), output.final.max(initial=0))) + 1  # > every start and edge
    for ids, started in output.segments:
        k, m = started.shape
        offsets = np.arange(m, dtype=np.int64) * spread
        flat = (started.T + offsets[:, None]).ravel()
        found = np.searchsorted(flat, (edges[ids] + offsets[:, None]).ravel()).reshape(m, n_edges)
        in_column = found - (np.arange(m, dtype=np.int64) * k)[:, None]
        below[ids] += in_column
        value = flat[np.minimum(found, len(flat) - 1)] - offsets[:, None]
        first_at[ids] = np.minimum(first_at[ids], np.where(in_column < k, value, first_at[ids]))
    return below[:, -1], np.diff(first_at, axis=1).astype(np.float64), np.diff(below, axis=1)


def _replica_mean(values: np.ndarray) -> np.ndarray:
    """Per-request mean over replicas (kept as integers with one replica)."""
    return values[0].copy() if len(values) == 1 else values.mean(axis=0)
