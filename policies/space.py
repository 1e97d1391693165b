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

SIGNAL_OPS: dict[str, str] = {
    "acceptance": "<=",
    "entropy": ">=",
    "query_drift": ">=",
    "acceptance_drop": ">=",
    "entropy_rise": ">=",
}
LEVEL_AND_DETERIORATION: tuple[str, ...] = ("acceptance", "entropy", "acceptance_drop", "entropy_rise")
# The paper's any-gate (section 4.4): acceptance low, entropy high, acceptance fallen or entropy
# risen since the refresh, or query drift high: five rules, one per signal.
PAPER_GATE_SIGNALS: tuple[str, ...] = LEVEL_AND_DETERIORATION + ("query_drift",)
FAMILIES: tuple[str, ...] = ("gate", "score")


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
        out = []
        for family in self.families:
            if (family == "gate" and (self.gate_signals or self.has_drift)) or (
                family == "score" and self.score_terms and self.score_grid
            ):
                out.append(family)
        return tuple(out)

    def suggest(self, trial: TrialLike) -> tuple[str, dict[str, Any]]:
        """Sample one policy: returns (family, policy JSON)."""
        families = self.active_families
        if not families:
            raise ValueError("the search space is empty: no family has a grid or a fitted score")
        family = trial.suggest_categorical("family", list(families))
        if family == "gate":
            return family, self._suggest_gate(trial)
        return family, self._suggest_score(trial)

    def _threshold(self, trial: TrialLike, name: str, signal: str) -> dict[str, Any]:
        grid = self.grids[signal]
        q = trial.suggest_int(name, 0, len(grid) - 1)
        return {"signal": signal, "op": SIGNAL_OPS[signal], "value": float(grid[q])}

    def _suggest_gate(self, trial: TrialLike) -> dict[str, Any]:
        signals = self.gate_signals
        rules: list[dict[str, Any]] = []
        if signals:
            n_rules = trial.suggest_int("gate_rules", 1, self.max_rules)
            for i in range(n_rules):
                signal = trial.suggest_categorical(f"gate_rule{i}_signal", list(signals))
                rules.append(self._threshold(trial, f"gate_rule{i}_{signal}_q", signal))
        combine = trial.suggest_categorical("gate_combine", ["any", "all"]) if len(rules) > 1 else "any"
        drift_mode = "none"
        if self.has_drift:
            drift_mode = trial.suggest_categorical("gate_drift", ["none", "or", "and"] if rules else ["or"])
        core: dict[str, Any] | None
        if not rules:
            core = None
        elif len(rules) == 1:
            core = rules[0]
        else:
            core = {combine: rules}
        if drift_mode == "none":
            assert core is not None
            top = rules if combine == "any" else [core]
            return {"kind": "gate", "any": top}
        drift = self._threshold(trial, "gate_drift_q", "query_drift")
        if core is None:
            return {"kind": "gate", "any": [drift]}
        if drift_mode == "or":
            top = (rules if combine == "any" else [core]) + [drift]
            return {"kind": "gate", "any": top}
        return {"kind": "gate", "any": [{"all": [core, drift]}]}

    def _suggest_score(self, trial: TrialLike) -> dict[str, Any]:
        q = trial.suggest_int("score_q", 0, len(self.score_grid) - 1)
        return {
            "kind": "score",
            "terms": [dict(t) for t in self.score_terms],
            "threshold": float(self.score_grid[q]),
        }

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


def policy_signals(policy: dict[str, Any]) -> set[str]:
    """Signals a gate or score policy JSON reads (empty for periodic)."""
    found: set[str] = set()
    if policy.get("kind") == "score":
        return {t["signal"] for t in policy.get("terms", []) if float(t.get("weight", 0.0)) > 0}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "signal" in node:
                found.add(node["signal"])
            for key in ("any", "all"):
                for child in node.get(key, []):
                    walk(child)

    walk(policy)
    return found
