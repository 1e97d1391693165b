"""A bench cell's controller for engines: calibrated without `query_drift`, confirmed in the closed loop.

No serving engine exposes the draft's pre-RoPE query summaries that `query_drift` needs
(docs/serving.md, section 1). When a cell's best controller reads it, `rift-ada bench
--export-controllers` ships beside it a second controller calibrated on the same probe traces and
splits with every other signal (:data:`ENGINE_SIGNALS`), confirmed in the closed loop on the same
confirmation requests exactly like the best one (its periodic reference and periodic refresh at its
own rate, paired-bootstrap CIs). A cell whose best controller already does without drift ships that
one alone. The result is kept in ``<cell>/engine.json`` and read back when its cell is unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write_json
from rift_ada.calibrate.export import json_safe
from rift_ada.controller import SIGNAL_NAMES, Controller

ENGINE_SIGNALS: tuple[str, ...] = tuple(name for name in SIGNAL_NAMES if name != "query_drift")
ENGINE_SUFFIX = "-engine"  # the engine controller's name: the best one's + this


def needs_engine_controller(controller: dict[str, Any]) -> bool:
    """Whether a controller reads a signal outside :data:`ENGINE_SIGNALS` (so an engine cannot feed it)."""
    return not set(Controller.from_dict(controller).signals_used) <= set(ENGINE_SIGNALS)


def _fingerprint(cell: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    return {"cell": cell["fingerprint"], "signals": list(ENGINE_SIGNALS), "best": best["name"]}


def finished_engine_controller(folder: Path, cell: dict[str, Any]) -> dict[str, Any] | None:
    """The engine controller an earlier ``--export-controllers`` run made for this unchanged cell, or None."""
    summary_file = folder / "engine.json"
    if not summary_file.exists():
        return None
    done = json.loads(summary_file.read_text(encoding="utf-8"))
    best = json.loads(Path(cell["controller_path"]).read_text(encoding="utf-8"))
    return done if done.get("fingerprint") == json_safe(_fingerprint(cell, best)) else None


def engine_controller(
    pair: Any,
    requests: Any,
    targets: Any,
    folder: Path,
    cell: dict[str, Any],
    *,
    size: Any,
    seed: int,
    dataset: str,
    stages: Any,
) -> dict[str, Any]:
    """The engine controller of one finished bench cell (see the module docstring); returns its summary."""
    from rift_ada.calibrate.closed_loop import attach_closed_confirmation
    from rift_ada.collectors.trace_io import read_probe_traces
    from rift_ada.experiments import bench
    from rift_ada.experiments.confirm import confirm_closed

    done = finished_engine_controller(folder, cell)
    if done is not None:
        return done
    best = json.loads(Path(cell["controller_path"]).read_text(encoding="utf-8"))
    summary_file = folder / "engine.json"
    fingerprint = _fingerprint(cell, best)
    if not needs_engine_controller(best):
        same = json_safe({"fingerprint": fingerprint, "same_as_best": True, "signals": list(ENGINE_SIGNALS)})
        atomic_write_json(summary_file, same)
        return same
    temperature, budget, tag = float(cell["temperature"]), int(cell["budget"]), f"{cell['tag']} engine"
    traces = read_probe_traces(folder / "probe")
    calibration, controller, controller_path = bench._calibrated(
        folder / "calibration-engine", folder / "probe", traces, name=f"{best['name']}{ENGINE_SUFFIX}", pair=pair,
        size=size, temperature=temperature, budget=budget, seed=seed, stages=stages, tag=tag, signals=ENGINE_SIGNALS,
    )  # fmt: skip
    by_id = {request.request_id: request for request in requests}
    held_out = [by_id[rid] for rid in sorted(str(r) for r in calibration["confirmation"]["request_ids"])]
    started = time.monotonic()
    confirmation = confirm_closed(
        calibration,
        controller,
        draft_model=pair.draft,
        target_model=pair.target,
        requests=held_out,
        targets=targets,
        settings=bench.cell_settings(pair, size, temperature=temperature, budget=budget, seed=seed, dataset=dataset),
        out_dir=folder / "confirm-engine",
        batch_size=size.batch_size,
        on_request=stages.counter(f"{tag} closed loop: confirmation", len(held_out)),
        on_tokens=stages.tokens(f"{tag} closed loop: confirmation"),
        free_running=bool(cell.get("free_running")),
    )
    stages.timed(f"{tag} closed loop", time.monotonic() - started)
    attach_closed_confirmation(folder / "calibration-engine", confirmation)
    summary = json_safe(
        {
            "fingerprint": fingerprint,
            "same_as_best": False,
            "signals": list(ENGINE_SIGNALS),
            "controller_name": str(controller["name"]),
            "controller_path": str(controller_path),
            "confirmation_ids": [str(request.request_id) for request in held_out],
            "confirmation": confirmation.to_dict(),
            "signals_used": sorted(Controller.load(controller_path).signals_used),
        }
    )
    atomic_write_json(summary_file, summary)
    return summary
