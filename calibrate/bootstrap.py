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


def paired_bootstrap(
    statistic: Any,
    n: int,
    *,
    n_resamples: int = 4999,
    confidence: float = 0.95,
    seed: int = 0,
    chunk: int = 1000,
) -> tuple[list[Interval], np.ndarray]:
    """BCa intervals of a multi-output statistic of ``n`` paired requests, resampling requests.

    ``statistic(index)`` takes an integer array (B, m) of request rows (a resample each, m = n, or
    m = n - 1 for the jackknife) and returns (B, k): k statistics recomputed from scratch on each
    resample, so a statistic built from several policies (a whole curve) keeps their pairing.
    Returns k intervals (percentile where BCa's acceleration is undefined, ``degenerate`` where every
    resample agrees) and the k bootstrap standard errors. NaN resamples are dropped per statistic.
    """
    rng = np.random.default_rng(seed)
    everyone = np.arange(n)[None, :]
    estimate = np.asarray(statistic(everyone), dtype=np.float64)[0]
    k = len(estimate)
    if n < 2:
        nan = float("nan")
        return [Interval(float(e), nan, nan, confidence, "none") for e in estimate], np.full(k, nan)
    draws = [np.asarray(statistic(rng.integers(0, n, size=(min(chunk, n_resamples - start), n))), dtype=np.float64)
             for start in range(0, n_resamples, chunk)]  # fmt: skip
    boot = np.concatenate(draws, axis=0)
    leave_one_out = np.array([np.delete(np.arange(n), i) for i in range(n)])
    jack = np.asarray(statistic(leave_one_out), dtype=np.float64)
    alpha = (1.0 - confidence) / 2.0
    intervals: list[Interval] = []
    spread = np.full(k, float("nan"))
    for j in range(k):
        theta, values = float(estimate[j]), boot[:, j][np.isfinite(boot[:, j])]
        if not np.isfinite(theta) or len(values) < 2:
            intervals.append(Interval(theta, float("nan"), float("nan"), confidence, "none"))
            continue
        spread[j] = float(np.std(values, ddof=1))
        if np.ptp(values) == 0.0:
            intervals.append(Interval(theta, float(values[0]), float(values[0]), confidence, "degenerate"))
            continue
        share = (np.sum(values < theta) + 0.5 * np.sum(values == theta)) / len(values)
        z0 = float(stats.norm.ppf(np.clip(share, 1.0 / len(values), 1.0 - 1.0 / len(values))))
        jacked = jack[:, j]
        method = "BCa"
        if np.all(np.isfinite(jacked)):
            deviation = jacked.mean() - jacked
            denominator = 6.0 * float(np.sum(deviation**2)) ** 1.5
            acceleration = float(np.sum(deviation**3)) / denominator if denominator > 0 else 0.0
        else:
            acceleration, method = 0.0, "BC"
        bounds = []
        for tail in (alpha, 1.0 - alpha):
            z = z0 + float(stats.norm.ppf(tail))
            bounds.append(float(stats.norm.cdf(z0 + z / (1.0 - acceleration * z))))
        low, high = np.quantile(values, bounds)
        intervals.append(Interval(theta, float(low), float(high), confidence, method))
    return intervals, spread
