"""``periodic``: refresh whenever the working set is ``interval`` committed tokens old (RIFT-dyn)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rift_ada.policy_kinds.base import PolicyKind
from rift_ada.validation import FiresFn, _integer, _join, _object

__all__ = ["Periodic"]


@dataclass(frozen=True)
class Periodic(PolicyKind):
    """Fire when the working set's age reaches ``interval`` (the schedule's min/max age still apply)."""

    interval: int
    kind: ClassVar[str] = "periodic"

    @classmethod
    def from_json(cls, value: Mapping[str, Any], path: str = "policy") -> Periodic:
        obj = _object(value, path, ("kind", "interval"))
        return cls._checked(_integer(obj["interval"], _join(path, "interval"), 1))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "interval": self.interval}

    def signals(self) -> frozenset[str]:
        return frozenset()

    def compile(self) -> FiresFn:
        interval = self.interval
        return lambda s, age: age >= interval
