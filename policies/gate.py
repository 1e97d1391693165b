"""Gate policies (any/all trees of threshold rules): replay lanes, search-space suggestion and rendering.

The tree itself, its validation and its scalar decision are the runtime kind
:class:`rift_ada.policy_kinds.Gate`; every walk here is a :meth:`~rift_ada.policy_kinds.Group.fold`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rift_ada.policies.kind_tools import KindTools, LaneParams
from rift_ada.policy_kinds import Gate, Rule

if TYPE_CHECKING:
    from rich.tree import Tree

    from rift_ada.policies.space import SearchSpace, TrialLike

__all__ = ["SIGNAL_OPS", "GateLanes", "GateTools"]

# The direction in which each signal means "stale": the operator of a searched rule on it.
SIGNAL_OPS: dict[str, str] = {
    "acceptance": "<=",
    "entropy": ">=",
    "query_drift": ">=",
    "acceptance_drop": ">=",
    "entropy_rise": ">=",
}
_UFUNCS = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater}
Node = Callable[[Mapping[str, np.ndarray], slice], np.ndarray]


def _combine(combine: str, children: list[Node]) -> Node:
    ufunc = np.logical_or if combine == "any" else np.logical_and

    def group(signals: Mapping[str, np.ndarray], sl: slice) -> np.ndarray:
        result = children[0](signals, sl)
        for child in children[1:]:
            result = ufunc(result, child(signals, sl))
        return result

    return group


class GateLanes:
    """One compiled tree for gates sharing a skeleton; each rule's threshold is a lane column."""

    def __init__(self, policies: Sequence[Gate], lanes_per_policy: int) -> None:
        self.params = LaneParams(lanes_per_policy)
        thresholds = [[rule.value for rule in policy.root.rules()] for policy in policies]
        columns = iter([self.params.add([row[j] for row in thresholds]) for j in range(len(thresholds[0]))])
        values = self.params.values

        def leaf(rule: Rule) -> Node:
            name, ufunc, column = rule.signal, _UFUNCS[rule.op], next(columns)
            return lambda signals, sl: ufunc(signals[name][sl], values[column])

        self._root: Node = policies[0].root.fold(leaf, _combine)

    def fires(self, signals: Mapping[str, np.ndarray], age: np.ndarray, lanes: slice) -> np.ndarray:
        return self._root(signals, lanes)

    def keep(self, mask: np.ndarray) -> None:
        self.params.keep(mask)


def _threshold(space: SearchSpace, trial: TrialLike, name: str, signal: str) -> dict[str, Any]:
    grid = space.grids[signal]
    q = trial.suggest_int(name, 0, len(grid) - 1)
    return {"signal": signal, "op": SIGNAL_OPS[signal], "value": float(grid[q])}


def _rendered(rule: Rule) -> Callable[[Tree], None]:
    def add(parent: Tree) -> None:
        from rich.text import Text

        value = f"{rule.value:.6g}"
        parent.add(Text.assemble((rule.signal, "cyan"), f" {rule.op} ", (value, "bold")))

    return add


def _rendered_group(combine: str, children: list[Callable[[Tree], None]]) -> Callable[[Tree], None]:
    def add(parent: Tree) -> None:
        from rich.text import Text

        branch = parent.add(Text(f"{combine.upper()} of", style="bold magenta"))
        for child in children:
            child(branch)

    return add


class GateTools(KindTools):
    kind = Gate
    searched = True

    @staticmethod
    def skeleton(policy: Gate) -> tuple:
        return ("gate", policy.root.fold(lambda r: ("rule", r.signal, r.op), lambda c, kids: (c, tuple(kids))))

    @staticmethod
    def lanes(policies: Sequence[Gate], lanes_per_policy: int) -> GateLanes:
        return GateLanes(policies, lanes_per_policy)

    @staticmethod
    def render(policy: Gate, tree: Tree) -> None:
        policy.root.fold(_rendered, _rendered_group)(tree)

    @staticmethod
    def searchable(space: SearchSpace) -> bool:
        return bool(space.gate_signals or space.has_drift)

    @staticmethod
    def suggest(space: SearchSpace, trial: TrialLike) -> dict[str, Any]:
        """Up to ``max_rules`` rules (``any`` or ``all``), then optionally a query-drift rule or-ed or and-ed."""
        signals = space.gate_signals
        rules: list[dict[str, Any]] = []
        if signals:
            n_rules = trial.suggest_int("gate_rules", 1, space.max_rules)
            for i in range(n_rules):
                signal = trial.suggest_categorical(f"gate_rule{i}_signal", list(signals))
                rules.append(_threshold(space, trial, f"gate_rule{i}_{signal}_q", signal))
        combine = trial.suggest_categorical("gate_combine", ["any", "all"]) if len(rules) > 1 else "any"
        drift_mode = "none"
        if space.has_drift:
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
        drift = _threshold(space, trial, "gate_drift_q", "query_drift")
        if core is None:
            return {"kind": "gate", "any": [drift]}
        if drift_mode == "or":
            top = (rules if combine == "any" else [core]) + [drift]
            return {"kind": "gate", "any": top}
        return {"kind": "gate", "any": [{"all": [core, drift]}]}
