"""Policy kinds' replay lanes, search spaces and rendering, monotonic-score fitting and vectorised replay.

The kinds themselves (parameters, validation, the scalar decision) are :mod:`rift_ada.policy_kinds`;
:mod:`rift_ada.policies.kinds` registers the tools of each beside it.

The single-policy entry point is ``rift_ada.policies.replay.replay`` (not re-exported here, so that
the name ``rift_ada.policies.replay`` keeps meaning the module).
"""

from __future__ import annotations

from typing import Any

from rift_ada.controller import make_controller_dict
from rift_ada.policies.evaluate import evaluate_policies, fidelity, resolve_policy_spec
from rift_ada.policies.replay import ReplayResult, named_policy_controller, replay_many
from rift_ada.policies.score import ScorePolicy, ScoreTerm, SignalSamples, counterfactual_samples

__all__ = [
    "ReplayResult",
    "ScorePolicy",
    "ScoreTerm",
    "SignalSamples",
    "counterfactual_samples",
    "evaluate_policies",
    "fidelity",
    "make_controller_dict",
    "named_policy_controller",
    "render_controller",
    "replay_many",
    "resolve_policy_spec",
]


def __getattr__(name: str) -> Any:
    if name == "render_controller":  # imports rich only when used
        from rift_ada.policies.render import render_controller

        return render_controller
    raise AttributeError(f"module 'rift_ada.policies' has no attribute {name!r}")
