"""Optuna search spaces for the adaptive policy families (``gate`` and ``score``).

Thresholds are never free floats: each one is an index into a percentile grid computed on the
calibration split (see ``rift_ada.calibrate.grids``), so every trial is a policy a person could
have written from the signal statistics, and TPE learns over a small discrete space.

Parameter names (stable; they appear in studies and in controller provenance):

* ``family``: one of the enabled families.
* gate: ``gate_rules`` (1..max_rules, default 5), ``gate_combine`` (``any``/``all``, when >1
  rule), ``gate_rule{i}_signal`` (any of the five signals with a grid), ``gate_rule{i}_{signal}_q``
  (grid index), ``gate_drift`` (``none``/``or``/``and``, when a query-drift grid exists) and
  ``gate_drift_q``. Five ``any`` rules, one per signal, are the paper's five-condition gate.
* score: ``score_q`` (index into the grid of fitted-score percentiles).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rift_ada.policies.gate import SIGNAL_OPS
from rift_ada.policies.kinds import SEARCHED, TOOLS

__all__ = [
    "FAMILIES",
    "LEVEL_AND_DETERIORATION",
    "PAPER_GATE_SIGNALS",
    "SIGNAL_OPS",
    "SearchSpace",
    "TrialLike",
]

LEVEL_AND_DETERIORATION: tuple[str, ...] = ("acceptance", "entropy", "acceptance_drop", "entropy_rise")
# The paper's any-gate (section 4.4): acceptance low, entropy high, acceptance fallen or entropy
# risen since the refresh, or query drift high: five rules, one per signal.
PAPER_GATE_SIGNALS: tuple[str, ...] = LEVEL_AND_DETERIORATION + ("query_drift",)
FAMILIES: tuple[str, ...] = SEARCHED  # ("gate", "score"): the kinds whose tools search


class TrialLike(Protocol):
    """The part of ``optuna.trial.Trial`` a search space uses."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...


@dataclass(frozen=True)
class SearchSpace:
    """Gate and score search spaces over percentile grids.

    ``grids``: signal -> sorted thresholds (from the calibration split). ``score_terms``: the terms
    of a ``ScorePolicy`` fitted on the calibration split; ``score_grid``: thresholds over its score
    percentiles. A family with nothing to search (no rule grids, no fitted score) is dropped.
    """

    grids: dict[str, tuple[float, ...]]
    families: tuple[str, ...] = FAMILIES
    score_terms: tuple[dict[str, Any], ...] = ()
    score_grid: tuple[float, ...] = ()
    max_rules: int = 5
    rule_signals: tuple[str, ...] = field(default=PAPER_GATE_SIGNALS)

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown policy family {unknown}: expected names from {list(FAMILIES)}")
        if self.max_rules < 1:
            raise ValueError("max_rules must be at least 1")

    @property
    def gate_signals(self) -> tuple[str, ...]:
        """Signals the gate rules may use (those of ``rule_signals`` with a non-empty grid)."""
        return tuple(s for s in self.rule_signals if self.grids.get(s))

    @property
    def has_drift(self) -> bool:
        return bool(self.grids.get("query_drift"))

    @property
    def active_families(self) -> tuple[str, ...]:
        """Families with something to search, in the order given."""
        return tuple(family for family in self.families if TOOLS[family].searchable(self))

    def suggest(self, trial: TrialLike) -> tuple[str, dict[str, Any]]:
        """Sample one policy: returns (family, policy JSON)."""
        families = self.active_families
        if not families:
            raise ValueError("the search space is empty: no family has a grid or a fitted score")
        family = trial.suggest_categorical("family", list(families))
        return family, TOOLS[family].suggest(self, trial)

    def to_dict(self) -> dict[str, Any]:
        return {
            "families": list(self.active_families),
            "max_rules": self.max_rules,
            "rule_signals": list(self.gate_signals),
            "grids": {k: list(v) for k, v in self.grids.items()},
            "score_terms": [dict(t) for t in self.score_terms],
            "score_grid": list(self.score_grid),
        }

    def fingerprint(self) -> str:
        """Short hash of the space: workers sharing a study must agree on it."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=float).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

