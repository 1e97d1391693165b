"""The workload pre-check: is there staleness for a refresh controller to fix, before calibrating?

Read from the probe traces a bench cell already collects (no model run): replay of RIFT-stat
(``stat``: the prefill selection, never refreshed), periodic refresh at each of ``intervals`` and
full KV, overall and by output position, and the retained attention mass over the output (the
share of full-KV attention the working set holds, paper Fig. 2) of the never-refreshed ``stat``
arm and of the freshest arm (``age:0``, rescored at every stride).

The yardstick is the **headroom**: the AL of the densest periodic refresh (the smallest interval)
minus RIFT-stat's, per request, with a paired bootstrap CI. It bounds what any refresh schedule of
that density can gain over never refreshing; a controller's gain over the periodic curve is a
part of it. (The stat-to-full gap is not a yardstick: in self-speculation full KV accepts every
draft token, so most of that gap is compression that no refresh recovers.)

Every probed request of the cell counts (the pre-check describes the workload; it feeds no grid,
search or operating point).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rift_ada.collectors.probe_traces import ARM_STAT, ProbeTraces, age_arm
from rift_ada.policy_spec import periodic_label


def _bin_means(values: np.ndarray) -> tuple[list[float | None], list[int]]:
    """Column means over the rows that have a value (NaN: none), and how many rows had one."""
    counts = np.sum(~np.isnan(values), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(values, axis=0) if len(values) else np.zeros(values.shape[1])
    return [None if n == 0 else float(m) for m, n in zip(means, counts, strict=True)], [int(n) for n in counts]


@dataclass(frozen=True)
class PreCheck:
    """The pre-check's settings: periodic intervals (the densest is the yardstick), position bin, bootstrap."""

    intervals: tuple[int, ...] = (16, 64, 128)
    position_bin: int = 64
    resamples: int = 2000
    seed: int = 0
    level: float = 0.95

    def run(self, traces: ProbeTraces, request_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """The pre-check of ``traces`` (or of the requests ``request_ids``), JSON-able."""
        from rift_ada.policies.replay import replay_many

        if not self.intervals or min(self.intervals) < 1:
            raise ValueError(f"precheck.intervals: need positive intervals, got {list(self.intervals)}")
        if request_ids is not None:
            wanted = {str(rid) for rid in request_ids}
            traces = traces.subset([i for i, rid in enumerate(traces.requests["request_id"]) if str(rid) in wanted])
        if traces.n_requests == 0:
            raise ValueError("precheck: no requests")
        longest = int(traces.osl.max()) - 1
        oldest = int(traces.age_grid.max()) if len(traces.age_grid) else 0
        intervals = sorted({d for d in self.intervals if min(d, longest) <= oldest})  # replayable without rounding
        specs = ["stat", *[periodic_label(d) for d in intervals], "full"]
        results = {r.policy: r for r in replay_many(traces, specs, position_bin=self.position_bin, seed=self.seed)}
        edges = [int(x) for x in results["stat"].position_edges]
        by_position: dict[str, Any] = {"bin_size": self.position_bin, "edges": edges, "al": {}, "n_requests": {}}
        for spec, result in results.items():
            by_position["al"][spec], by_position["n_requests"][spec] = _bin_means(result.al_by_position)
        out: dict[str, Any] = {
            "n_requests": traces.n_requests,
            "osl": {
                "min": int(traces.osl.min()),
                "mean": float(traces.osl.mean()),
                "max": int(traces.osl.max()),
            },
            "policies": {
                spec: {"mean_al": float(result.mean_al), "refreshes_per_1k": float(result.refreshes_per_1k)}
                for spec, result in results.items()
            },
            "by_position": by_position,
            "retained_mass": self._retained_mass(traces, len(edges) - 1),
            "settings": {
                "intervals": intervals,
                "position_bin": self.position_bin,
                "resamples": self.resamples,
                "seed": self.seed,
                "level": self.level,
                "source": "replay of the cell's probe traces (all probed requests)",
            },
        }
        if intervals:
            densest = periodic_label(intervals[0])
            out["densest"] = densest
            out["headroom"] = self._paired(results[densest].al - results["stat"].al)
            out["headroom"]["densest"] = densest
            out["headroom_share_of_stat"] = out["headroom"]["estimate"] / results["stat"].mean_al
        return out

    def _paired(self, differences: np.ndarray) -> dict[str, Any]:
        """Mean of per-request differences with a percentile bootstrap CI over requests (seeded) and their SD."""
        differences = np.asarray(differences, dtype=float)
        n = len(differences)
        rng = np.random.default_rng(self.seed)
        means = differences[rng.integers(0, n, (self.resamples, n))].mean(axis=1)
        tail = (1.0 - self.level) / 2.0
        return {
            "estimate": float(differences.mean()),
            "low": float(np.quantile(means, tail)),
            "high": float(np.quantile(means, 1.0 - tail)),
            "sd": float(differences.std(ddof=1)) if n > 1 else None,
            "n": n,
            "per_request": [float(x) for x in differences],
        }

    def _retained_mass(self, traces: ProbeTraces, n_bins: int) -> dict[str, Any]:
        """Per output-position bin: mean over requests of the stride-level retained mass, per arm."""
        mass = traces.stride_signals.get("retained_mass")
        if mass is None:
            return {}
        stride = traces.decision_stride
        starts = np.arange(mass.shape[-1]) * stride  # each stride's first position
        bins = starts // self.position_bin
        out: dict[str, Any] = {}
        for arm, label in ((ARM_STAT, "stat"), (age_arm(0), "age:0")):
            if arm not in traces.arms:
                continue
            values = mass[:, traces.arm_index(arm), :].astype(float)  # (R, S), NaN past a request's end
            per_bin = np.full((traces.n_requests, n_bins), np.nan)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                for index in range(n_bins):
                    inside = bins == index
                    if inside.any():
                        per_bin[:, index] = np.nanmean(values[:, inside], axis=1)
            out[label], _ = _bin_means(per_bin)
        return out


def precheck_verdict(precheck: dict[str, Any]) -> str:
    """One plain sentence: does the cell have staleness for refresh to fix?"""
    headroom = precheck.get("headroom")
    if not headroom:
        return "No periodic interval could be replayed on these traces, so the headroom is unknown."
    low, high, estimate = headroom["low"], headroom["high"], headroom["estimate"]
    densest = headroom["densest"]
    if low > 0:
        return (
            f"Staleness exists: refreshing at {densest} gains {estimate:+.3f} AL over RIFT-stat "
            f"[{low:+.3f}, {high:+.3f}] — the most any refresh schedule that dense can add here."
        )
    return (
        f"No staleness shown: {densest} gains {estimate:+.3f} AL over RIFT-stat [{low:+.3f}, {high:+.3f}]; "
        "a controller has (almost) nothing to gain over never refreshing on this cell."
    )


__all__ = ["PreCheck", "precheck_verdict"]
