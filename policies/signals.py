"""The one decision-signal engine: every controller signal for many lanes at once (numpy; the
per-lane decision step is one compiled loop, :mod:`rift_ada.policies.kernels`).

A lane is one walk of one request under one policy (and, at T > 0, one sampling replica). Replay
(:mod:`rift_ada.policies.replay`), the threshold grids (:mod:`rift_ada.calibrate.grids`) and the
score fit (:func:`rift_ada.policies.score.counterfactual_samples`) all feed their rounds through
this engine, so they see the signals a deployed :class:`rift_ada.Session` computes; the Session
(standard library, scalar) is the reference and tests/test_signals.py holds them equal at every
decision point. The definitions are written once, in docs/controller.md:

* ``acceptance``: EWMA (alpha) over the last ``rounds`` completed rounds' AL, oldest first,
  seeded with the oldest;
* ``entropy``: mean draft entropy over the positions recorded since the previous decision (the
  caller passes the committed-conditioned positions: accepted drafts and the first rejected one);
* ``query_drift``: supplied by the caller (the collector measured it against the refresh's stride);
* ``acceptance_drop`` / ``entropy_rise``: the baseline is the value at the first decision at which
  at least ``rounds`` rounds have completed since the last refresh (so every round of the
  acceptance window lies after the refresh); at that decision the signal is 0, before it missing
  (NaN), after it ``baseline - acceptance`` (``entropy - baseline``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rift_ada.controller import SIGNAL_NAMES
from rift_ada.policies.kernels import decide_lanes

__all__ = ["SignalEngine"]

_NO_LANES = np.empty(0)  # the acceptance array where it is not computed


class SignalEngine:
    """Signal state of ``n_lanes`` lanes stepped in lockstep (every lane records one round per step).

    ``alpha``: the EWMA weight, a float or one value per lane; ``rounds``: the acceptance window
    (shared by all lanes); ``need``: the signals to compute (others come back absent);
    ``max_accepted``: the caller promises integer ALs in 0 .. max_accepted (replay's rounds). Then,
    with one ``alpha`` for all lanes, the EWMA of every possible window is tabulated once by the
    same recurrence (:class:`_WindowTable`), each lane keeps its window as one integer, and a
    decision reads its acceptance with one lookup; results are bit-identical to the recurrence.
    """

    def __init__(
        self,
        n_lanes: int,
        *,
        alpha: float | np.ndarray,
        rounds: int,
        need: Iterable[str] = SIGNAL_NAMES,
        max_accepted: int | None = None,
    ) -> None:
        need = set(need)
        unknown = need - set(SIGNAL_NAMES)
        if unknown:
            raise ValueError(f"unknown signals {sorted(unknown)} (known: {', '.join(SIGNAL_NAMES)})")
        if rounds < 1:
            raise ValueError("rounds must be >= 1")
        self.rounds = int(rounds)
        self.alpha = alpha
        self.one_minus_alpha = 1.0 - alpha
        self.need_drop = "acceptance_drop" in need
        self.need_rise = "entropy_rise" in need
        self.need_acceptance = self.need_drop or "acceptance" in need
        self.need_entropy = self.need_rise or "entropy" in need
        self.need_drift = "query_drift" in need
        self.need_baselines = self.need_drop or self.need_rise
        self.history: list[np.ndarray] = []  # AL of the last `rounds` rounds, oldest first
        self.window_table: _WindowTable | None = None
        if self.need_acceptance and max_accepted is not None and np.ndim(alpha) == 0:
            self.window_table = _WindowTable.build(float(alpha), self.rounds, int(max_accepted))
        if self.window_table is not None:
            self.window = np.full(n_lanes, self.window_table.empty, dtype=np.int64)  # each lane's window code
        self.entropy_sum = np.zeros(n_lanes)
        self.entropy_count = np.zeros(n_lanes)
        self.rounds_recorded = 0  # rounds every lane has recorded (lanes step in lockstep)
        # a lane's window lies after its refresh once rounds_recorded >= ready_from
        self.ready_from = np.full(n_lanes, self.rounds, dtype=np.int64)
        self.base_acceptance = np.full(n_lanes, np.nan)
        self.base_entropy = np.full(n_lanes, np.nan)

    def record_round(
        self, accepted_len: np.ndarray, entropy_sum: np.ndarray | None = None, entropy_count: np.ndarray | None = None
    ) -> None:
        """One round per lane: its AL and the sum / count of its committed-conditioned draft entropies."""
        if self.window_table is not None:
            self.window = self.window_table.shift.take(self.window)
            self.window += accepted_len
        elif self.need_acceptance:
            self.history.append(np.asarray(accepted_len, dtype=np.float64))
            if len(self.history) > self.rounds:
                del self.history[0]
        if self.need_entropy:
            assert entropy_sum is not None and entropy_count is not None
            self.entropy_sum += entropy_sum
            self.entropy_count += entropy_count
        self.rounds_recorded += 1

    def decide(self, decision: np.ndarray, drift: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Signals of every lane (meaningful where ``decision``); updates the decision lanes' state.

        As :meth:`rift_ada.Session.decide`: entropy accumulators of the deciding lanes restart, and a
        deciding lane whose window lies after its refresh takes its baselines (one compiled loop,
        :func:`rift_ada.policies.kernels.decide_lanes`).
        """
        signals: dict[str, np.ndarray] = {}
        acceptance = _NO_LANES
        if self.need_acceptance:
            acceptance = self._ewma() if self.window_table is None else self.window_table.ewma.take(self.window)
            signals["acceptance"] = acceptance
        if self.need_drop or self.need_entropy:  # the loop does nothing for acceptance or drift alone
            drop, entropy, rise = decide_lanes(
                acceptance,
                self.entropy_sum,
                self.entropy_count,
                self.base_acceptance,
                self.base_entropy,
                self.ready_from,
                self.rounds_recorded,
                decision,
                self.need_drop,
                self.need_entropy,
                self.need_rise,
            )
            if self.need_drop:
                signals["acceptance_drop"] = drop
            if self.need_entropy:
                signals["entropy"] = entropy
            if self.need_rise:
                signals["entropy_rise"] = rise
        if self.need_drift:
            signals["query_drift"] = np.full(len(decision), np.nan) if drift is None else drift
        return signals

    def _ewma(self) -> np.ndarray:
        if not self.history:
            return np.full(len(self.ready_from), np.nan)
        return _window_ewma(self.history, self.alpha, self.one_minus_alpha)

    def refreshed(self, refresh: np.ndarray) -> None:
        """The lanes in ``refresh`` refreshed their working set: drop baselines, restart the round count."""
        if not self.need_baselines:
            return
        if self.need_drop:
            np.putmask(self.base_acceptance, refresh, np.nan)
        if self.need_rise:
            np.putmask(self.base_entropy, refresh, np.nan)
        np.putmask(self.ready_from, refresh, self.rounds_recorded + self.rounds)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the lanes where ``mask`` is False."""
        self.history = [h[mask] for h in self.history]
        if self.window_table is not None:
            self.window = self.window[mask]
        for name in ("entropy_sum", "entropy_count", "ready_from", "base_acceptance", "base_entropy"):
            setattr(self, name, getattr(self, name)[mask])
        if isinstance(self.alpha, np.ndarray):
            self.alpha = self.alpha[mask]
            self.one_minus_alpha = self.one_minus_alpha[mask]


def _window_ewma(history: list[np.ndarray], alpha: Any, one_minus_alpha: Any) -> np.ndarray:
    """The acceptance EWMA of a window of rounds (oldest first, seeded with the oldest)."""
    acceptance = history[0]
    for accepted_len in history[1:]:
        acceptance = alpha * accepted_len + one_minus_alpha * acceptance
    return acceptance


_WINDOW_TABLE_ENTRIES = 1 << 16  # larger windows fall back to the recurrence at every decision


@dataclass(frozen=True)
class _WindowTable:
    """The acceptance EWMA of every window of ``rounds`` integer ALs in 0 .. max_accepted.

    A window is coded by its base-(max_accepted + 2) digits, oldest first; the digit
    max_accepted + 1 marks "no round yet" (only ever in the oldest places), so ``empty`` (all such
    digits) is a lane before its first round. ``shift`` maps a code to the code with its oldest
    round dropped and the newest place 0: adding the next AL gives the next window.
    """

    ewma: np.ndarray
    shift: np.ndarray
    empty: int

    @classmethod
    def build(cls, alpha: float, rounds: int, max_accepted: int) -> _WindowTable | None:
        """The table (made by :func:`_window_ewma`), or None past ``_WINDOW_TABLE_ENTRIES`` codes."""
        digits = max_accepted + 2
        size = digits**rounds
        if size > _WINDOW_TABLE_ENTRIES:
            return None
        code = np.arange(size, dtype=np.int64)
        places = [(code // digits ** (rounds - 1 - i)) % digits for i in range(rounds)]  # oldest first
        ewma = np.full(size, np.nan)
        for missing in range(rounds):  # windows whose `missing` oldest places hold no round yet
            held = np.ones(size, dtype=bool)
            for i, place in enumerate(places):
                held &= (place == digits - 1) if i < missing else (place < digits - 1)
            history = [place[held].astype(np.float64) for place in places[missing:]]
            ewma[held] = _window_ewma(history, alpha, 1.0 - alpha)
        return cls(ewma=ewma, shift=(code % (size // digits)) * digits, empty=size - 1)
