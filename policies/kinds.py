"""The policies-side registry: per runtime kind (:data:`rift_ada.policy_kinds.KINDS`), its :class:`KindTools`.

Replay (vector lanes), the search space (suggestion) and rendering look a kind up here by its name;
none of them branches on kind names.
"""

from __future__ import annotations

import inspect

from rift_ada.policies.gate import GateTools
from rift_ada.policies.kind_tools import KindTools
from rift_ada.policies.periodic import PeriodicTools
from rift_ada.policies.score import ScoreTools
from rift_ada.policy_kinds import KINDS, PolicyKind

__all__ = ["SEARCHED", "TOOLS", "tools_of"]

TOOLS: dict[str, type[KindTools]] = {tools.kind.kind: tools for tools in (PeriodicTools, GateTools, ScoreTools)}
# Families of the calibration search, in registry order.
SEARCHED: tuple[str, ...] = tuple(name for name, tools in TOOLS.items() if tools.searched)
if set(TOOLS) != set(KINDS):
    raise ImportError(f"policy kinds {sorted(KINDS)} and their tools {sorted(TOOLS)} differ: register both")
_UNFINISHED = {name: sorted(tools.__abstractmethods__) for name, tools in TOOLS.items() if inspect.isabstract(tools)}
if _UNFINISHED:
    raise ImportError(f"policy kind tools leave methods unimplemented: {_UNFINISHED}")


def tools_of(policy: PolicyKind) -> type[KindTools]:
    """The tools of a kind object."""
    return TOOLS[policy.kind]
