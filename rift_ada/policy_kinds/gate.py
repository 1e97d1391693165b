"""``gate``: an any/all tree of threshold rules on the signals; a rule on a missing signal does not hold.

The tree is typed (:class:`Rule` leaves, :class:`Group` nodes); :meth:`Group.fold` is the one walk over
it (JSON, the scalar decision, the signals, and on the policies side replay's lanes and rendering).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from rift_ada.policy_kinds.base import PolicyKind
from rift_ada.validation import (
    MAX_DEPTH,
    OPERATORS,
    SIGNAL_INDEX,
    ControllerError,
    FiresFn,
    _describe,
    _join,
    _number,
    _object,
    _shown,
    _signal,
)

__all__ = ["COMBINES", "Gate", "Group", "Rule"]

COMBINES: tuple[str, ...] = ("any", "all")
T = TypeVar("T")


@dataclass(frozen=True)
class Rule:
    """``signal op value``, e.g. ``acceptance <= 5.1``."""

    signal: str
    op: str
    value: float

    def fold(self, rule: Callable[[Rule], T], group: Callable[[str, list[T]], T]) -> T:
        return rule(self)

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "op": self.op, "value": self.value}

    def compile(self) -> FiresFn:
        i = SIGNAL_INDEX[self.signal]
        v = self.value
        op = self.op
        if op == "<=":
            return lambda s, age: s[i] <= v
        if op == "<":
            return lambda s, age: s[i] < v
        if op == ">=":
            return lambda s, age: s[i] >= v
        return lambda s, age: s[i] > v


@dataclass(frozen=True)
class Group:
    """``combine`` (``any`` or ``all``) of its children (rules or groups)."""

    combine: str
    children: tuple[Rule | Group, ...]

    def fold(self, rule: Callable[[Rule], T], group: Callable[[str, list[T]], T]) -> T:
        """Bottom-up walk: ``rule(leaf)`` per rule, ``group(combine, child results)`` per group (depth first)."""
        return group(self.combine, [child.fold(rule, group) for child in self.children])

    def rules(self) -> list[Rule]:
        """The rules in depth-first order."""
        return self.fold(lambda r: [r], lambda _, found: [r for rules in found for r in rules])

    def to_json(self) -> dict[str, Any]:
        return self.fold(Rule.to_json, lambda combine, children: {combine: children})


def _node(value: Any, path: str, depth: int) -> Rule | Group:
    if depth > MAX_DEPTH:
        raise ControllerError(path, f"nesting deeper than {MAX_DEPTH} levels")
    if not isinstance(value, Mapping):
        raise ControllerError(path, f"expected a rule or an any/all group object, got {_describe(value)}")
    groups = [key for key in COMBINES if key in value]
    if len(groups) > 1:
        raise ControllerError(path, "has both 'any' and 'all'; nest them instead")
    if groups:
        key = groups[0]
        _object(value, path, (key,))
        return _group(key, value[key], _join(path, key), depth)
    _object(value, path, ("signal", "op", "value"))
    op = value["op"]
    if not isinstance(op, str) or op not in OPERATORS:
        shown = op if isinstance(op, str) else _describe(op)
        raise ControllerError(_join(path, "op"), f"unknown operator {_shown(shown)} (allowed: {' '.join(OPERATORS)})")
    return Rule(_signal(value["signal"], _join(path, "signal")), op, _number(value["value"], _join(path, "value")))


def _group(combine: str, children: Any, path: str, depth: int) -> Group:
    if not isinstance(children, (list, tuple)):
        raise ControllerError(path, f"expected a list of rules or groups, got {_describe(children)}")
    if not children:
        raise ControllerError(path, "must not be empty")
    return Group(combine, tuple(_node(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(children)))


def _either(first: FiresFn, second: FiresFn) -> FiresFn:
    return lambda s, age: first(s, age) or second(s, age)


def _both(first: FiresFn, second: FiresFn) -> FiresFn:
    return lambda s, age: first(s, age) and second(s, age)


def _compile_group(combine: str, children: list[FiresFn]) -> FiresFn:
    if len(children) == 1:
        return children[0]
    if len(children) == 2:
        return (_either if combine == "any" else _both)(*children)
    if combine == "any":
        return lambda s, age: any(child(s, age) for child in children)
    return lambda s, age: all(child(s, age) for child in children)


@dataclass(frozen=True)
class Gate(PolicyKind):
    """Fire when the ``root`` group holds (the policy object's own ``any`` or ``all`` list)."""

    root: Group
    kind: ClassVar[str] = "gate"

    @classmethod
    def from_json(cls, value: Mapping[str, Any], path: str = "policy") -> Gate:
        groups = [key for key in COMBINES if key in value]
        if not groups:
            raise ControllerError(_join(path, "any"), "a gate policy needs 'any' or 'all'")
        if len(groups) > 1:
            raise ControllerError(path, "has both 'any' and 'all'; nest them instead")
        key = groups[0]
        _object(value, path, ("kind", key))
        return cls._checked(_group(key, value[key], _join(path, key), 1))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.root.to_json()}

    def signals(self) -> frozenset[str]:
        return frozenset(rule.signal for rule in self.root.rules())

    def compile(self) -> FiresFn:
        return self.root.fold(Rule.compile, _compile_group)
