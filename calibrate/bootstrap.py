"""Paired bootstrap confidence intervals over requests (``scipy.stats.bootstrap``, ``paired=True``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies strictly on one side of zero."""
        return bool(self.low > 0.0 or self.high < 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "method": self.method,
            "excludes_zero": self.excludes_zero,
        }


def _refresh_reduction(ctl: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    """1 - sum(ctl) / sum(base): the share of the baseline's refreshes the controller saves."""
    base_total = np.sum(base, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 - np.sum(ctl, axis=axis) / base_total


def _mean_difference(ctl: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    """mean(ctl) - mean(base), paired by request."""
    return np.mean(ctl, axis=axis) - np.mean(base, axis=axis)


def _paired_interval(
    statistic: Any,
    ctl: np.ndarray,
    base: np.ndarray,
    *,
    n_resamples: int,
    confidence: float,
    seed: int,
) -> Interval:
    ctl = np.asarray(ctl, dtype=np.float64)
    base = np.asarray(base, dtype=np.float64)
    if ctl.shape != base.shape or ctl.ndim != 1:
        raise ValueError(f"paired bootstrap needs two 1-D arrays of equal length, got {ctl.shape} and {base.shape}")
    estimate = float(statistic(ctl, base))
    if len(ctl) < 2 or not np.isfinite(estimate):
        return Interval(estimate, float("nan"), float("nan"), confidence, "none")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = stats.bootstrap(
                (ctl, base),
                statistic,
                paired=True,
                vectorized=True,
                n_resamples=n_resamples,
                confidence_level=confidence,
                method=method,
                rng=np.random.default_rng(seed),
            )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return Interval(estimate, low, high, confidence, method)
    # Every resample gives the same value (e.g. identical arrays): the interval is that point.
    resampled = np.asarray(result.bootstrap_distribution, dtype=np.float64)
    finite = resampled[np.isfinite(resampled)]
    if len(finite) and np.ptp(finite) == 0.0:
        return Interval(estimate, float(finite[0]), float(finite[0]), confidence, "degenerate")
    return Interval(estimate, float("nan"), float("nan"), confidence, "none")


def refresh_reduction_ci(
    refreshes_ctl: np.ndarray,
    refreshes_base: np.ndarray,
    *,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """CI of 1 - sum(ref_ctl) / sum(ref_base), resampling requests in pairs."""
    return _paired_interval(
        _refresh_reduction,
        refreshes_ctl,
        refreshes_base,
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
    )


def al_difference_ci(
    al_ctl: np.ndarray,
    al_base: np.ndarray,
    *,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """CI of mean(AL_ctl) - mean(AL_base) (macro over requests), resampling requests in pairs."""
    return _paired_interval(
        _mean_difference,
        al_ctl,
        al_base,
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
    )
