"""Per-signal percentile threshold grids from the calibration split.

The signal values are rebuilt from the probe traces the way a controller sees them at its
decision points, under every ``age:N`` arm (so the pool covers every working-set age a policy can
reach): rounds are rebuilt from the arm's per-position outcomes (T = 0: AL = 1 + leading matches,
at most K; T > 0: expected AL from the product of acceptance probabilities), a decision happens
after each round that completes a stride, and there

* ``acceptance`` = EWMA (alpha) over the last ``rounds`` completed rounds' AL,
* ``entropy`` = mean draft entropy over the latest completed stride,
* ``query_drift`` = the arm's per-stride ``query_drift`` signal,
* ``acceptance_drop`` / ``entropy_rise`` = the ``age:0`` arm's value at the stride where this
  arm's working set was refreshed, minus (plus) the value now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.probe_traces import ProbeTraces, age_arm

SIGNALS: tuple[str, ...] = ("acceptance", "entropy", "query_drift", "acceptance_drop", "entropy_rise")
DEFAULT_PERCENTILES: tuple[float, ...] = tuple(float(p) for p in range(5, 100, 5))


@dataclass(frozen=True)
class ThresholdGrids:
    """Candidate thresholds per signal (sorted, unique) and the percentiles they came from."""

    percentiles: tuple[float, ...]
    values: dict[str, tuple[float, ...]]
    n_decisions: int

    def grid(self, signal: str) -> tuple[float, ...]:
        """Thresholds of ``signal``; KeyError naming the available signals if absent."""
        try:
            return self.values[signal]
        except KeyError:
            raise KeyError(f"no threshold grid for {signal!r} (have {', '.join(self.values)})") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "percentiles": list(self.percentiles),
            "n_decisions": self.n_decisions,
            "values": {k: list(v) for k, v in self.values.items()},
        }


def check_signal_columns(traces: ProbeTraces, signals: Iterable[str]) -> None:
    """Refuse traces with NaN inside the response length of a column the selected signals use."""
    osl = traces.osl
    n_pos = traces.outcome.shape[2]
    valid = np.arange(n_pos)[None, :] < osl[:, None]  # (R, P)
    ids = np.asarray(traces.requests["request_id"]).astype(str)
    age_arms = [traces.arm_index(age_arm(int(a))) for a in traces.age_grid]
    columns: dict[str, np.ndarray] = {}
    wanted = set(signals)
    if wanted & {"acceptance", "acceptance_drop"}:
        columns["outcome"] = traces.outcome[:, age_arms]
    if wanted & {"entropy", "entropy_rise"}:
        columns["entropy"] = traces.entropy[:, age_arms]
    if "query_drift" in wanted:
        if "query_drift" not in traces.stride_signals:
            raise CalibrationError("signal column 'query_drift' is missing from the traces")
        stride = traces.decision_stride
        n_strides = traces.stride_signals["query_drift"].shape[2]
        stride_valid = (np.arange(n_strides) * stride)[None, :] < osl[:, None]
        drift = traces.stride_signals["query_drift"][:, age_arms]
        bad = np.isnan(drift) & stride_valid[:, None, :]
        if bad.any():
            _raise_nan("query_drift", bad, ids)
    for name, array in columns.items():
        bad = np.isnan(array) & valid[:, None, :]
        if bad.any():
            _raise_nan(name, bad, ids)


def _raise_nan(column: str, bad: np.ndarray, ids: np.ndarray) -> None:
    rows = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))
    shown = ", ".join(ids[rows[:5]])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    raise CalibrationError(
        f"signal column {column!r} has {int(bad.sum())} NaN values inside the response length "
        f"(requests {shown}{more}); re-collect or drop these requests"
    )


def _round_als(outcome: np.ndarray, start: np.ndarray, osl: np.ndarray, k: int, greedy: bool) -> np.ndarray:
    """AL of a round starting at ``start`` for each request (outcome: (R, P))."""
    n_req, n_pos = outcome.shape
    offsets = start[:, None] + np.arange(k)[None, :]
    inside = offsets < osl[:, None]
    window = np.where(inside, outcome[np.arange(n_req)[:, None], np.minimum(offsets, n_pos - 1)], 0.0)
    window = np.nan_to_num(window, nan=0.0)
    if greedy:
        leading = np.cumprod(window > 0.5, axis=1).sum(axis=1)
        return 1.0 + leading
    return 1.0 + np.cumprod(window, axis=1).sum(axis=1)


def _arm_decisions(
    outcome: np.ndarray,
    entropy: np.ndarray,
    osl: np.ndarray,
    *,
    k: int,
    stride: int,
    greedy: bool,
    alpha: float,
    rounds: int,
    n_strides: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Acceptance and entropy at the decision of each stride, (R, S), NaN where none happened."""
    n_req = outcome.shape[0]
    acceptance = np.full((n_req, n_strides), np.nan)
    history = np.full((n_req, rounds), np.nan)  # oldest first
    committed = np.zeros(n_req, dtype=np.int64)
    ent = np.nan_to_num(entropy, nan=0.0)
    csum = np.concatenate([np.zeros((n_req, 1)), np.cumsum(ent, axis=1)], axis=1)
    rows = np.arange(n_req)
    while True:
        active = committed < osl
        if not active.any():
            break
        al = _round_als(outcome, committed, osl, k, greedy)
        advance = np.maximum(1, np.rint(al).astype(np.int64))
        new = np.minimum(committed + advance, osl)
        history = np.where(active[:, None], np.concatenate([history[:, 1:], al[:, None]], axis=1), history)
        ewma = history[:, 0].copy()
        for j in range(1, rounds):
            col = history[:, j]
            ewma = np.where(np.isnan(ewma), col, np.where(np.isnan(col), ewma, alpha * col + (1 - alpha) * ewma))
        decided = active & (new // stride > committed // stride)
        s = new // stride - 1
        acceptance[rows[decided], np.minimum(s[decided], n_strides - 1)] = ewma[decided]
        committed = np.where(active, new, committed)
    starts = np.arange(n_strides) * stride
    ends = np.minimum(starts + stride, outcome.shape[1])
    counts = np.maximum(ends - starts, 1)
    entropy_stride = (csum[:, ends] - csum[:, starts]) / counts[None, :]
    entropy_stride = np.where(~np.isnan(acceptance), entropy_stride, np.nan)
    return acceptance, entropy_stride


def decision_signals(traces: ProbeTraces, *, ewma_alpha: float = 0.4, ewma_rounds: int = 4) -> dict[str, np.ndarray]:
    """Signal values at every decision point under every ``age:N`` arm.

    Returns name -> 1-D array; all arrays are aligned (row i is one decision) and hold NaN where a
    signal is undefined there (a deterioration before the first refresh stride, no drift column).
    """
    ages = [int(a) for a in traces.age_grid]
    if not ages:
        raise CalibrationError("the traces have no 'age:N' arms; cannot build threshold grids")
    stride = traces.decision_stride
    n_strides = -(-traces.outcome.shape[2] // stride)
    osl = traces.osl
    greedy = traces.temperature == 0
    per_arm_acc: dict[int, np.ndarray] = {}
    per_arm_ent: dict[int, np.ndarray] = {}
    for age in ages:
        a = traces.arm_index(age_arm(age))
        per_arm_acc[age], per_arm_ent[age] = _arm_decisions(
            traces.outcome[:, a].astype(np.float64),
            traces.entropy[:, a].astype(np.float64),
            osl,
            k=traces.draft_length,
            stride=stride,
            greedy=greedy,
            alpha=ewma_alpha,
            rounds=ewma_rounds,
            n_strides=n_strides,
        )
    base_acc = _ffill(per_arm_acc[ages[0]])
    base_ent = _ffill(per_arm_ent[ages[0]])
    drift = traces.stride_signals.get("query_drift")
    pools: dict[str, list[np.ndarray]] = {name: [] for name in SIGNALS}
    for age in ages:
        acc, ent = per_arm_acc[age], per_arm_ent[age]
        mask = ~np.isnan(acc)
        shift = age // stride
        ref_acc = np.full_like(base_acc, np.nan)
        ref_ent = np.full_like(base_ent, np.nan)
        if shift < n_strides:
            ref_acc[:, shift:] = base_acc[:, : n_strides - shift]
            ref_ent[:, shift:] = base_ent[:, : n_strides - shift]
        pools["acceptance"].append(acc[mask])
        pools["entropy"].append(ent[mask])
        pools["acceptance_drop"].append((ref_acc - acc)[mask])
        pools["entropy_rise"].append((ent - ref_ent)[mask])
        if drift is not None:
            pools["query_drift"].append(drift[:, traces.arm_index(age_arm(age))].astype(np.float64)[mask])
        else:
            pools["query_drift"].append(np.full(int(mask.sum()), np.nan))
    return {name: np.concatenate(parts) for name, parts in pools.items()}


def _ffill(values: np.ndarray) -> np.ndarray:
    """Forward-fill NaN along the last axis (the value at the most recent decision)."""
    idx = np.where(~np.isnan(values), np.arange(values.shape[1])[None, :], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    out = values[np.arange(values.shape[0])[:, None], idx]
    return out


def percentile_grid(values: np.ndarray, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> tuple[float, ...]:
    """Sorted unique percentile values (rounded to 6 significant digits for stable JSON)."""
    if len(values) == 0:
        return ()
    raw = np.percentile(np.asarray(values, dtype=np.float64), list(percentiles))
    return tuple(sorted({float(f"{v:.6g}") for v in raw}))


def threshold_grids(
    traces: ProbeTraces,
    signals: Sequence[str] = SIGNALS,
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    ewma_alpha: float = 0.4,
    ewma_rounds: int = 4,
) -> ThresholdGrids:
    """Percentile grids (default 5th..95th) of each selected signal on ``traces`` (the calibration split).

    Raises :class:`CalibrationError` naming the column if a selected signal has NaN values inside
    a response, or if a signal yields no values at all.
    """
    unknown = [s for s in signals if s not in SIGNALS]
    if unknown:
        raise CalibrationError(f"unknown signal(s) {unknown}: expected names from {list(SIGNALS)}")
    check_signal_columns(traces, signals)
    pooled = decision_signals(traces, ewma_alpha=ewma_alpha, ewma_rounds=ewma_rounds)
    values: dict[str, tuple[float, ...]] = {}
    for name in signals:
        column = pooled[name][~np.isnan(pooled[name])]
        if len(column) == 0:
            raise CalibrationError(f"signal column {name!r} has no values on the calibration split")
        values[name] = percentile_grid(column, percentiles)
    n_decisions = int(len(pooled["acceptance"]))
    return ThresholdGrids(percentiles=tuple(float(p) for p in percentiles), values=values, n_decisions=n_decisions)
