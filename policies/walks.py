"""The periodic walks that pool every working-set age the probe arms cover.

Threshold grids (:mod:`rift_ada.calibrate.grids`) and the monotonic score's refresh gains
(:mod:`rift_ada.policies.score`) read signals at the decision points of these walks, so both see the
ages a deployed controller can reach. Model-free; policies/ needs nothing from calibrate/ for them.
"""

from __future__ import annotations

from typing import Any

from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.controller import make_controller_dict
from rift_ada.policy_kinds import Periodic


def walk_controllers(traces: ProbeTraces, *, ewma_alpha: float = 0.4, ewma_rounds: int = 4) -> list[dict[str, Any]]:
    """Periodic walks whose decisions pool every working-set age the arms cover.

    One periodic controller per probed age g > 0 (interval g, ``min_age`` 0, ``max_age`` g, the
    traces' decision stride): together their decisions see ages from 0 to the oldest arm, each
    walk with the refreshes (and so the deterioration baselines) a deployed controller has.
    Raises ``ValueError`` when the traces have no ``age:N`` arm with N > 0.
    """
    ages = [int(a) for a in traces.age_grid if int(a) > 0]
    if not ages:
        raise ValueError("the traces need 'age:N' arms with N > 0 to build threshold grids")
    return [
        make_controller_dict(
            Periodic(age).to_json(),
            name=f"walk:{age}",
            draft="grids",
            target="grids",
            temperature=float(traces.temperature),
            schedule={"decision_stride": int(traces.decision_stride), "min_age": 0, "max_age": age},
            signals={"acceptance": {"ewma_alpha": float(ewma_alpha), "rounds": int(ewma_rounds)}},
        )
        for age in ages
    ]
