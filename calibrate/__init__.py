"""Model-free calibration: splits, threshold grids, the Optuna study, bootstrap CIs, export and report.

Entry point: :func:`calibrate` (probe traces and a :class:`CalibrationConfig` in; controller JSON,
``calibration.json`` and ``report.md`` out). Nothing here loads or runs a model: the experiments that do
(the benchmark, closed-loop confirmation, fidelity) are :mod:`rift_ada.experiments`. Names are imported
lazily so that ``import rift_ada.calibrate`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "CalibrationError": "rift_ada.calibrate.splits",
    "Splits": "rift_ada.calibrate.splits",
    "make_splits": "rift_ada.calibrate.splits",
    "SIGNALS": "rift_ada.calibrate.grids",
    "ThresholdGrids": "rift_ada.calibrate.grids",
    "threshold_grids": "rift_ada.calibrate.grids",
    "check_signal_columns": "rift_ada.calibrate.grids",
    "decision_signals": "rift_ada.calibrate.grids",
    "Interval": "rift_ada.calibrate.bootstrap",
    "al_difference_ci": "rift_ada.calibrate.bootstrap",
    "refresh_reduction_ci": "rift_ada.calibrate.bootstrap",
    "OperatingPoint": "rift_ada.calibrate.operating_point",
    "TrialPoint": "rift_ada.calibrate.operating_point",
    "pareto_front": "rift_ada.calibrate.operating_point",
    "select_operating_point": "rift_ada.calibrate.operating_point",
    "PolicyEvaluator": "rift_ada.calibrate.study",
    "StudyTask": "rift_ada.calibrate.study",
    "baseline_labels": "rift_ada.calibrate.study",
    "open_storage": "rift_ada.calibrate.study",
    "run_study": "rift_ada.calibrate.study",
    "run_worker": "rift_ada.calibrate.study",
    "study_points": "rift_ada.calibrate.study",
    "atomic_write_json": "rift_ada.atomic",
    "controller_dict": "rift_ada.calibrate.export",
    "export_controller": "rift_ada.calibrate.export",
    "render_markdown": "rift_ada.calibrate.report",
    "write_report": "rift_ada.calibrate.report",
    "CalibrationConfig": "rift_ada.calibrate.config",
    "ConfigError": "rift_ada.calibrate.config",
    "CalibrationResult": "rift_ada.calibrate.pipeline",
    "calibrate": "rift_ada.calibrate.pipeline",
    "check_traces_match": "rift_ada.calibrate.pipeline",
    "verdict": "rift_ada.calibrate.pipeline",
    "ClosedConfirmation": "rift_ada.calibrate.closed_loop",
    "attach_closed_confirmation": "rift_ada.calibrate.closed_loop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rift_ada.calibrate' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
