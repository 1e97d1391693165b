"""Gate policies: nested any/all combinations of threshold rules on controller signals."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rift_ada.controller import OPERATORS, SIGNAL_NAMES, ControllerError, validate_policy
from rift_ada.policies.periodic import Policy

__all__ = ["GatePolicy", "all_of", "any_of", "rule"]


def rule(signal: str, op: str, value: float) -> dict[str, Any]:
    """A threshold rule node, e.g. ``rule("acceptance", "<=", 5.1)``."""
    if signal not in SIGNAL_NAMES:
        raise ValueError(f"unknown signal {signal!r} (known: {', '.join(SIGNAL_NAMES)})")
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r} (allowed: {' '.join(OPERATORS)})")
    return {"signal": signal, "op": op, "value": float(value)}


def any_of(*nodes: Mapping[str, Any]) -> dict[str, Any]:
    """A group node that fires when any child fires."""
    return {"any": [dict(node) for node in nodes]}


def all_of(*nodes: Mapping[str, Any]) -> dict[str, Any]:
    """A group node that fires when every child fires."""
    return {"all": [dict(node) for node in nodes]}


def _rules(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    for key in ("any", "all"):
        if key in node:
            return [found for child in node[key] for found in _rules(child)]
    return [dict(node)]


def _replace_values(node: Mapping[str, Any], values: list[float]) -> dict[str, Any]:
    for key in ("any", "all"):
        if key in node:
            return {key: [_replace_values(child, values) for child in node[key]]}
    return {**node, "value": float(values.pop(0))}


@dataclasses.dataclass
class GatePolicy(Policy):
    """Fire when the rule tree holds. ``tree`` is ``{"any": [...]}`` or ``{"all": [...]}`` (a lone rule
    is wrapped in ``any``); children are rules ``{"signal", "op", "value"}`` or nested groups.
    A rule on a missing signal does not hold.
    """

    tree: dict[str, Any] = dataclasses.field(default_factory=lambda: any_of(rule("acceptance", "<=", 5.0)))
    kind: ClassVar[str] = "gate"

    def __post_init__(self) -> None:
        if not isinstance(self.tree, Mapping):
            raise ControllerError("policy", f"expected a gate tree object, got {type(self.tree).__name__}")
        if "any" not in self.tree and "all" not in self.tree:
            self.tree = any_of(self.tree)
        self.to_policy_json()

    def to_policy_json(self) -> dict[str, Any]:
        return validate_policy({"kind": "gate", **copy.deepcopy(self.tree)})

    @classmethod
    def from_policy_json(cls, data: Mapping[str, Any]) -> GatePolicy:
        policy = cls._validated(data)
        return cls(tree={key: value for key, value in policy.items() if key != "kind"})

    @property
    def rules(self) -> list[dict[str, Any]]:
        """The rule nodes in depth-first order."""
        return _rules(self.tree)

    @property
    def thresholds(self) -> list[float]:
        """Rule thresholds in depth-first order (the numbers a calibration search tunes)."""
        return [node["value"] for node in self.rules]

    @property
    def signals(self) -> list[str]:
        """Distinct signals the tree reads, in first-use order."""
        return list(dict.fromkeys(node["signal"] for node in self.rules))

    def with_thresholds(self, values: Sequence[float]) -> GatePolicy:
        """Same tree with new thresholds (depth-first order)."""
        values = [float(v) for v in values]
        if len(values) != len(self.rules):
            raise ValueError(f"expected {len(self.rules)} thresholds, got {len(values)}")
        return GatePolicy(tree=_replace_values(self.tree, values))
