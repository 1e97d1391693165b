"""Compiled (numba) per-lane loops of replay's decision step.

A replay iteration at a few thousand lanes costs what numpy's fixed per-call overhead costs: the
signal engine's decision and a score policy's sum took about 45 array passes per round, each
1-3 µs whatever its size. These loops do the same arithmetic lane by lane in one call. Every
operation is the one the numpy code did, in the same order (numba neither reassociates nor fuses
multiply-adds unless asked), so results are bit-identical to it and to :class:`rift_ada.Session`
(tests/test_signals.py, tests/test_replay.py).

Compiled on first use and cached beside this file (``cache=True``; numba falls back to a per-user
cache directory where this one is read-only).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = {"cache": True, "error_model": "numpy", "nogil": True}


@njit(**_JIT)
def knot_value(z: float, xs: np.ndarray, ys: np.ndarray, slopes: np.ndarray, count: int) -> float:
    """:func:`rift_ada.controller.knot_transform` of ``z`` through the first ``count`` knots."""
    if z <= xs[0]:
        return ys[0]
    if z >= xs[count - 1]:
        return ys[count - 1]
    if z != z:
        return z
    segment = 0
    while segment < count - 2 and xs[segment + 1] <= z:
        segment += 1
    return ys[segment] + slopes[segment] * (z - xs[segment])


@njit(**_JIT)
def score_totals(
    signals: tuple,
    start: int,
    params: np.ndarray,
    knot_xs: np.ndarray,
    knot_ys: np.ndarray,
    knot_slopes: np.ndarray,
    knot_counts: np.ndarray,
    out: np.ndarray,
) -> None:
    """A score policy's sum for lanes ``start .. start + len(out)`` of the ``signals`` (one per term).

    ``params[3 j : 3 j + 3, i]``: term j's mean, orientation / scale and weight for lane i (rows of
    one column serve every lane); ``knot_*[j, i]``: its knots (``knot_counts[j] == 0``: none; one
    row serves every lane). As the controller: a missing (NaN) signal contributes 0.
    """
    n = len(out)
    out[:] = 0.0
    lane_step = 0 if params.shape[1] == 1 else 1
    knot_step = 0 if knot_xs.shape[1] == 1 else 1
    for j in range(len(signals)):  # term by term: each lane's sum keeps the controller's order
        values = signals[j][start : start + n]
        means, factors, weights = params[3 * j], params[3 * j + 1], params[3 * j + 2]
        if knot_counts[j] == 0 and lane_step == 0:  # one set of numbers for every lane
            mean, factor, weight = means[0], factors[0], weights[0]
            for i in range(n):
                value = values[i]
                term = (value - mean) * factor * weight
                out[i] = out[i] + term if value == value else out[i]  # a missing (NaN) signal adds nothing
        elif knot_counts[j] == 0:
            for i in range(n):
                value = values[i]
                term = (value - means[i]) * factors[i] * weights[i]
                out[i] = out[i] + term if value == value else out[i]
        else:
            count = knot_counts[j]
            for i in range(n):
                value = values[i]
                if value == value:
                    z = (value - means[i * lane_step]) * factors[i * lane_step]
                    k = i * knot_step
                    z = knot_value(z, knot_xs[j, k], knot_ys[j, k], knot_slopes[j, k], count)
                    out[i] += z * weights[i * lane_step]


@njit(**_JIT)
def decide_lanes(
    acceptance: np.ndarray,
    entropy_sum: np.ndarray,
    entropy_count: np.ndarray,
    base_acceptance: np.ndarray,
    base_entropy: np.ndarray,
    ready_from: np.ndarray,
    rounds_recorded: int,
    decision: np.ndarray,
    need_drop: bool,
    need_entropy: bool,
    need_rise: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(acceptance_drop, entropy, entropy_rise) of every lane; updates the deciding lanes' state.

    As :meth:`rift_ada.Session.decide`: a deciding lane restarts its entropy accumulators, and one
    whose window lies after its refresh (``ready_from <= rounds_recorded``) takes the baselines it
    lacks. Arrays of signals not needed come back empty.
    """
    n = len(decision)
    drop = np.empty(n if need_drop else 0)
    entropy = np.empty(n if need_entropy else 0)
    rise = np.empty(n if need_rise else 0)
    for i in range(n):
        ready = decision[i] and ready_from[i] <= rounds_recorded
        if need_drop:
            if ready and base_acceptance[i] != base_acceptance[i]:
                base_acceptance[i] = acceptance[i]
            drop[i] = base_acceptance[i] - acceptance[i]
        if need_entropy:
            value = entropy_sum[i] / entropy_count[i]  # NaN where nothing was recorded
            entropy[i] = value
            if decision[i]:
                entropy_sum[i] = 0.0
                entropy_count[i] = 0.0
            if need_rise:
                if ready and base_entropy[i] != base_entropy[i]:
                    base_entropy[i] = value
                rise[i] = value - base_entropy[i]
    return drop, entropy, rise
