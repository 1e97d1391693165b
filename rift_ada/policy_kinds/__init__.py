"""Policy kinds: one module per kind of controller ``policy`` object, registered here. Standard library only.

Each kind is a frozen dataclass of its parameters (:class:`~rift_ada.policy_kinds.base.PolicyKind`):
``from_json`` (the validator, with field paths), ``to_json``, ``signals()`` and ``compile()`` (the
scalar decision :class:`rift_ada.Controller` runs). :func:`from_json` reads any ``policy`` object by its
``kind``. Replay's vector lanes, the search-space suggestion and rendering of each kind live beside it
in :mod:`rift_ada.policies.kinds`. Adding a kind: docs/design-notes.md ("Adding a policy kind").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rift_ada.policy_kinds.base import PolicyKind
from rift_ada.policy_kinds.gate import Gate, Group, Rule
from rift_ada.policy_kinds.periodic import Periodic
from rift_ada.policy_kinds.score import Score, Term, knot_transform
from rift_ada.validation import ControllerError, _describe, _join, _shown

__all__ = [
    "KINDS",
    "POLICY_KINDS",
    "Gate",
    "Group",
    "Periodic",
    "PolicyKind",
    "Rule",
    "Score",
    "Term",
    "from_json",
    "knot_transform",
]

# The registry: kind name -> class, in the order error messages list them.
KINDS: dict[str, type[PolicyKind]] = {kind.kind: kind for kind in (Periodic, Gate, Score)}
POLICY_KINDS: tuple[str, ...] = tuple(KINDS)


def from_json(value: Any, path: str = "policy") -> PolicyKind:
    """The kind object of a ``policy`` object; ControllerError naming the field (under ``path``) when invalid."""
    if not isinstance(value, Mapping):
        raise ControllerError(path, f"expected an object, got {_describe(value)}")
    if "kind" not in value:
        raise ControllerError(_join(path, "kind"), "missing required field")
    kind = value["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(POLICY_KINDS)
        raise ControllerError(_join(path, "kind"), f"unknown policy kind {_shown(kind)} (known: {known})")
    return KINDS[kind].from_json(value, path)
