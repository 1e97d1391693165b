"""Rich rendering of a controller (``rift-ada show``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from rich.tree import Tree

from rift_ada import policy_kinds
from rift_ada.controller import Controller
from rift_ada.policies.kinds import tools_of

__all__ = ["render_controller", "render_policy"]


def _number(value: float) -> str:
    return f"{value:.6g}"


def render_policy(policy: Mapping[str, Any], parent: Tree | None = None) -> Tree:
    """Tree of a validated ``policy`` object (added under ``parent`` when given); the kind's tools add its rules."""
    kind = policy_kinds.from_json(policy)
    label = Text.assemble(("policy: ", "bold"), (kind.kind, "green"))
    tree = parent.add(label) if parent is not None else Tree(label)
    tools_of(kind).render(kind, tree)
    return tree


def render_controller(controller: Mapping[str, Any] | Controller) -> Tree:
    """Tree view: identity, cache, schedule, signals, the policy's rule tree, calibration summary."""
    data = controller.to_dict() if isinstance(controller, Controller) else Controller.from_dict(controller).to_dict()
    root = Tree(
        Text.assemble(
            ("controller ", "bold"),
            (data["name"], "bold green"),
            f"  draft={data['draft']}  target={data['target']}  T={_number(data['temperature'])}",
        )
    )
    cache = data["cache"]
    root.add("cache: " + ", ".join(f"{key}={value}" for key, value in cache.items()))
    schedule = data["schedule"]
    root.add(
        f"schedule: decide every {schedule['decision_stride']} tokens; "
        f"refresh if age >= {schedule['max_age']}, "
        f"else if the policy fires and age >= {schedule['min_age']}"
    )
    acceptance = data["signals"]["acceptance"]
    root.add(f"signals: acceptance = EWMA(α={_number(acceptance['ewma_alpha'])}) over {acceptance['rounds']} rounds")
    render_policy(data["policy"], root)
    if "calibration" in data:
        calibration = root.add("calibration")
        for key, value in data["calibration"].items():
            shown = value if isinstance(value, (str, int, float, bool)) or value is None else f"{type(value).__name__}"
            calibration.add(f"{key}: {shown}")
    return root
