"""Periodic refresh (RIFT-dyn as a controller policy) and the base class of the policy families."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from rift_ada.controller import Controller, ControllerError, make_controller_dict, validate_policy

__all__ = ["Policy", "PeriodicPolicy"]


class Policy:
    """Base of the policy families: explicit dataclass parameters, JSON conversion, sklearn-style params."""

    kind: ClassVar[str] = ""

    def to_policy_json(self) -> dict[str, Any]:
        """The ``policy`` object of a controller JSON (validated)."""
        raise TypeError(f"{type(self).__name__} does not define to_policy_json")

    @classmethod
    def from_policy_json(cls, data: Mapping[str, Any]) -> Self:
        """Build from a ``policy`` object; raises ControllerError (naming the field) when invalid."""
        raise TypeError(f"{cls.__name__} does not define from_policy_json")

    @classmethod
    def _validated(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        policy = validate_policy(data)
        if policy["kind"] != cls.kind:
            raise ControllerError("policy.kind", f"expected {cls.kind!r}, got {policy['kind']!r}")
        return policy

    def to_controller_dict(
        self,
        *,
        name: str,
        draft: str,
        target: str,
        temperature: float,
        cache: Mapping[str, Any] | None = None,
        schedule: Mapping[str, Any] | None = None,
        signals: Mapping[str, Any] | None = None,
        calibration: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A full, validated controller dict with DESIGN.md defaults for whatever is not given."""
        return make_controller_dict(
            self.to_policy_json(),
            name=name,
            draft=draft,
            target=target,
            temperature=temperature,
            cache=cache,
            schedule=schedule,
            signals=signals,
            calibration=calibration,
        )

    def to_controller(self, **kwargs: Any) -> Controller:
        """A runtime :class:`rift_ada.Controller` (same keyword arguments as :meth:`to_controller_dict`)."""
        return Controller.from_dict(self.to_controller_dict(**kwargs))

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters (deep copies)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields}

    def set_params(self, **params: Any) -> Self:
        """Set constructor parameters in place (re-validated); returns self."""
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        for key, value in params.items():
            if key not in names:
                raise ValueError(f"{type(self).__name__} has no parameter {key!r}")
            setattr(self, key, value)
        self.to_policy_json()
        return self


@dataclasses.dataclass
class PeriodicPolicy(Policy):
    """Fire whenever the working set is at least ``interval`` committed tokens old (RIFT-dyn, Δ = interval).

    Decisions still happen only every ``decision_stride`` tokens, and ``min_age``/``max_age`` of
    the schedule still apply; use ``schedule={"min_age": 0}`` for intervals below the default 32.
    """

    interval: int = 128
    kind: ClassVar[str] = "periodic"

    def __post_init__(self) -> None:
        self.to_policy_json()

    def to_policy_json(self) -> dict[str, Any]:
        return validate_policy({"kind": "periodic", "interval": self.interval})

    @classmethod
    def from_policy_json(cls, data: Mapping[str, Any]) -> PeriodicPolicy:
        return cls(interval=cls._validated(data)["interval"])
