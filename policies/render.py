"""Rich rendering of a controller (``rift-ada show``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from rich.tree import Tree

from rift_ada.controller import Controller

__all__ = ["render_controller", "render_policy"]


def _number(value: float) -> str:
    return f"{value:.6g}"


def _gate_node(parent: Tree, node: Mapping[str, Any]) -> None:
    for key in ("any", "all"):
        if key in node:
            branch = parent.add(Text(f"{key.upper()} of", style="bold magenta"))
            for child in node[key]:
                _gate_node(branch, child)
            return
    parent.add(Text.assemble((node["signal"], "cyan"), f" {node['op']} ", (_number(node["value"]), "bold")))


def render_policy(policy: Mapping[str, Any], parent: Tree | None = None) -> Tree:
    """Tree of a validated ``policy`` object (added under ``parent`` when given)."""
    kind = policy["kind"]
    label = Text.assemble(("policy: ", "bold"), (kind, "green"))
    tree = parent.add(label) if parent is not None else Tree(label)
    if kind == "periodic":
        tree.add(f"refresh when age >= {policy['interval']}")
    elif kind == "gate":
        _gate_node(tree, {key: policy[key] for key in ("any", "all") if key in policy})
    else:
        tree.add(Text.assemble("fires when score >= ", (_number(policy["threshold"]), "bold")))
        terms = tree.add("score = Σ weight · g(orientation · (signal − mean) / scale)")
        for term in policy["terms"]:
            sign = "+" if term["orientation"] > 0 else "−"
            text = Text.assemble(
                (_number(term["weight"]), "bold"),
                " · ",
                ("g" if "knots" in term else "", ""),
                f"({sign}({term['signal']} − {_number(term['mean'])}) / {_number(term['scale'])})",
            )
            node = terms.add(text)
            if "knots" in term:
                node.add("knots " + ", ".join(f"({_number(x)}, {_number(y)})" for x, y in term["knots"]))
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
