"""The base of a policy kind: its parameters as a frozen dataclass, read from and written to JSON."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from rift_ada.validation import FiresFn

__all__ = ["PolicyKind"]


class PolicyKind(ABC):
    """One kind of controller ``policy`` object (``{"kind": ..., ...}``); subclasses are frozen dataclasses.

    ``from_json`` is the one validator (it raises :class:`~rift_ada.validation.ControllerError` naming
    the field path under ``path``); a kind built directly (``Periodic(64)``) is checked by it too.
    """

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        type(self).from_json(self.to_json())

    @classmethod
    def _checked(cls, *values: Any) -> Self:
        """An instance of fields ``from_json`` has just checked (not checked again)."""
        obj = object.__new__(cls)
        for spec, value in zip(dataclasses.fields(cls), values, strict=True):  # type: ignore[arg-type]
            object.__setattr__(obj, spec.name, value)
        return obj

    @classmethod
    @abstractmethod
    def from_json(cls, value: Mapping[str, Any], path: str = "policy") -> Self:
        """The kind's parameters from a ``policy`` object whose ``kind`` is this kind."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The normalised ``policy`` object (``kind`` first; plain JSON types)."""

    @abstractmethod
    def signals(self) -> frozenset[str]:
        """Names of the signals the policy reads."""

    @abstractmethod
    def compile(self) -> FiresFn:
        """The scalar decision ``fires(signals, age) -> bool`` (signals indexed as ``SIGNAL_NAMES``)."""
