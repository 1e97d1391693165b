"""Per-signal percentile threshold grids from the calibration split.

The signal values are those a controller sees at its decision points: replay's signal engine
(:mod:`rift_ada.policies.signals`) walks every request under periodic refresh at each probed age
(:func:`rift_ada.policies.walks.walk_controllers`, so the pool covers every working-set age a policy can reach), with
replay's rounds (ages interpolated between arms; T = 0 exact, T > 0 acceptance sampled per
position over seeded replicas), and records every signal at every decision. The definitions of
the signals are in docs/controller.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.probe_traces import ProbeTraces, age_arm
from rift_ada.controller import SIGNAL_NAMES
from rift_ada.policies.replay import decision_points
from rift_ada.policies.walks import walk_controllers

SIGNALS: tuple[str, ...] = SIGNAL_NAMES
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


def decision_signals(
    traces: ProbeTraces,
    *,
    ewma_alpha: float = 0.4,
    ewma_rounds: int = 4,
    replicas: int | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Signal values at every decision point of the :func:`~rift_ada.policies.walks.walk_controllers` walks.

    The rounds and signals come from replay's signal engine (interpolated arms; at T > 0 sampled
    acceptance, ``replicas`` seeded replicas), so the grids see the distribution a controller sees.
    Returns name -> 1-D array, all aligned (row i is one decision), NaN where a signal is missing
    there (no deterioration baseline yet, no drift column).
    """
    try:
        walks = walk_controllers(traces, ewma_alpha=ewma_alpha, ewma_rounds=ewma_rounds)
    except ValueError as error:
        raise CalibrationError(str(error)) from None
    return decision_points(traces, walks, replicas=replicas, seed=seed).signals


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
    seed: int = 0,
) -> ThresholdGrids:
    """Percentile grids (default 5th..95th) of each selected signal on ``traces`` (the calibration split).

    Raises :class:`CalibrationError` naming the column if a selected signal has NaN values inside
    a response, or if a signal yields no values at all.
    """
    unknown = [s for s in signals if s not in SIGNALS]
    if unknown:
        raise CalibrationError(f"unknown signal(s) {unknown}: expected names from {list(SIGNALS)}")
    check_signal_columns(traces, signals)
    pooled = decision_signals(traces, ewma_alpha=ewma_alpha, ewma_rounds=ewma_rounds, seed=seed)
    values: dict[str, tuple[float, ...]] = {}
    for name in signals:
        column = pooled[name][~np.isnan(pooled[name])]
        if len(column) == 0:
            raise CalibrationError(f"signal column {name!r} has no values on the calibration split")
        values[name] = percentile_grid(column, percentiles)
    n_decisions = int(len(pooled["acceptance"]))
    return ThresholdGrids(percentiles=tuple(float(p) for p in percentiles), values=values, n_decisions=n_decisions)
