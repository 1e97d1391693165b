"""The closed-loop confirmation's record and how it becomes a calibration's verdict (model-free).

:func:`rift_ada.experiments.confirm.confirm_closed` runs the loop and returns a
:class:`ClosedConfirmation`; :func:`attach_closed_confirmation` writes it into the calibration's
own files (``calibration.json``, ``report.md``, the provenance of ``controller.json``), which this
package owns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write_json, canonical_json
from rift_ada.calibrate.export import export_controller
from rift_ada.calibrate.report import write_report

__all__ = ["ClosedConfirmation", "attach_closed_confirmation"]


@dataclass
class ClosedConfirmation:
    """Closed-loop confirmation of one calibration (per policy: closed-loop and replay figures)."""

    run_dir: str
    free_running: bool
    request_ids: list[str]
    policies: dict[str, dict[str, Any]]  # replay label -> role, closed-loop label, closed, replay
    comparisons: list[dict[str, Any]]
    verdict: dict[str, Any]
    replay_verdict: dict[str, Any]
    seed: int
    n_resamples: int
    notes: list[str] = field(default_factory=list)
    curve: dict[str, Any] | None = None  # the pre-registered curve verdict (CurveVerdict.to_dict())

    @property
    def gain(self) -> bool:
        return bool(self.verdict["gain"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "free_running": self.free_running,
            "n_requests": len(self.request_ids),
            "request_ids": list(self.request_ids),
            "policies": self.policies,
            "comparisons": self.comparisons,
            "verdict": self.verdict,
            "replay_verdict": self.replay_verdict,
            "seed": self.seed,
            "n_resamples": self.n_resamples,
            "notes": list(self.notes),
            "curve": self.curve,
        }


def attach_closed_confirmation(calibration_dir: str | Path, confirmation: ClosedConfirmation) -> dict[str, Any]:
    """Make the closed-loop verdict the calibration's verdict (replay's kept beside it).

    Rewrites ``calibration.json``, the report and the provenance of ``controller.json`` in
    ``calibration_dir``; returns the updated calibration dict.
    """
    folder = Path(calibration_dir)
    calibration = json.loads((folder / "calibration.json").read_text(encoding="utf-8"))
    conf = calibration["confirmation"]
    conf.setdefault("replay_verdict", conf["verdict"])  # attaching twice keeps replay's own verdict
    conf["closed_loop"] = confirmation.to_dict()
    conf["verdict"] = confirmation.verdict
    atomic_write_json(folder / "calibration.json", calibration)
    controller_path = folder / calibration.get("controller", "controller.json")
    if controller_path.exists():
        controller = json.loads(controller_path.read_text(encoding="utf-8"))
        provenance = controller.setdefault("calibration", {}).setdefault("confirmation", {})
        provenance["closed_loop"] = {
            "comparisons": confirmation.comparisons,
            "margin": confirmation.verdict["margin"],
            "gain": confirmation.gain,
            "free_running": confirmation.free_running,
            "n_requests": len(confirmation.request_ids),
        }
        if confirmation.curve is not None:  # the pre-registered curve verdict, in brief
            gap = confirmation.curve["gap"]
            provenance["closed_loop"]["curve"] = {
                "outcome": confirmation.curve["outcome"],
                "al_gain": gap["al_gain"],
                "refresh_reduction": gap["refresh_reduction"],
                "curve": [point["label"] for point in gap["curve"]],
            }
        provenance["gain"] = confirmation.gain
        provenance["source"] = "closed loop"
        export_controller(controller, controller_path)
    write_report(json.loads(canonical_json(calibration)), folder)
    return calibration
