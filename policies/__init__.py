"""Policy families, their search spaces, monotonic-score fitting and vectorised replay.

The single-policy entry point is ``rift_ada.policies.replay.replay`` (not re-exported here, so that
the name ``rift_ada.policies.replay`` keeps meaning the module).
"""

from __future__ import annotations

from typing import Any

from rift_ada.controller import make_controller_dict, validate_policy
from rift_ada.policies.evaluate import evaluate_policies, fidelity, resolve_policy_spec
from rift_ada.policies.gate import GatePolicy, all_of, any_of, rule
from rift_ada.policies.periodic import PeriodicPolicy, Policy
from rift_ada.policies.replay import ReplayResult, named_policy_controller, replay_many
from rift_ada.policies.score import ScorePolicy, ScoreTerm, SignalSamples, counterfactual_samples

__all__ = [
    "GatePolicy",
    "PeriodicPolicy",
    "Policy",
    "ReplayResult",
    "ScorePolicy",
    "ScoreTerm",
    "SignalSamples",
    "all_of",
    "any_of",
    "counterfactual_samples",
    "evaluate_policies",
    "fidelity",
    "make_controller_dict",
    "named_policy_controller",
    "policy_from_json",
    "render_controller",
    "replay_many",
    "resolve_policy_spec",
    "rule",
]


def policy_from_json(data: dict[str, Any]) -> Policy:
    """The policy-family object for a ``policy`` JSON object (by its ``kind``); ControllerError if invalid."""
    families: dict[str, type[Policy]] = {"periodic": PeriodicPolicy, "gate": GatePolicy, "score": ScorePolicy}
    return families[validate_policy(data)["kind"]].from_policy_json(data)


def __getattr__(name: str) -> Any:
    if name == "render_controller":  # imports rich only when used
        from rift_ada.policies.render import render_controller

        return render_controller
    raise AttributeError(f"module 'rift_ada.policies' has no attribute {name!r}")
