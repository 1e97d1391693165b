"""Replay fidelity on a real model: replay vs closed loop for the same policies on the same requests.

``measure_fidelity`` generates target responses, collects probe traces, runs the closed loop
(teacher-forced at T = 0, free-running rejection sampling at T > 0) for ``stat``, periodic
refresh and a gate controller, replays the same policies over the probe traces (T > 0: seeded
replicas, mean and spread) and returns one row per policy. ``benchmarks/fidelity.py`` prints
the table recorded in docs/calibration.md; a slow test runs a small case. Model code is imported
only when the function runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.controller import make_controller_dict
from rift_ada.policies.replay import replay_many
from rift_ada.policy_spec import periodic_label

__all__ = [
    "FidelityCase",
    "FidelitySetup",
    "fidelity_gate",
    "fidelity_policies",
    "fidelity_rows",
    "fidelity_setup",
    "measure_fidelity",
    "read_fidelity_case",
    "reopen_fidelity",
]


@dataclass(frozen=True)
class FidelityCase:
    """What a fidelity run measures."""

    n_requests: int = 6
    output_tokens: int = 512
    budget: int = 256
    temperature: float = 0.0
    periodic: tuple[int, ...] = (64,)
    arm_ages: tuple[int, ...] = (0, 32, 64, 128, 256, 512)
    replicas: int = 8
    seed: int = 0
    dataset: str = "embedded:small"
    max_isl: int = 1100
    dtype: str | None = None  # the model's; None: the loader's default (float32 on the CPU)


def fidelity_gate(settings: Any, max_age: int) -> dict[str, Any]:
    """The gate controller measured: acceptance low or entropy risen since the refresh."""
    return make_controller_dict(
        {
            "kind": "gate",
            "any": [
                {"signal": "acceptance", "op": "<=", "value": 6.0},
                {"signal": "entropy_rise", "op": ">=", "value": 0.3},
            ],
        },
        name="gate",
        draft=settings.draft,
        target=settings.target,
        temperature=settings.temperature,
        cache=settings.cache_json(),
        schedule={"decision_stride": settings.decision_stride, "min_age": 32, "max_age": max_age},
    )


@dataclass
class FidelitySetup:
    """The model pair, requests, collection settings and target rows of a fidelity run."""

    pair: Any
    requests: list[Any]
    settings: Any
    targets: list[dict[str, Any]]


def fidelity_setup(out_dir: str | Path, case: FidelityCase, model: str = "smollm2-135m") -> FidelitySetup:
    """Load the model and requests of ``case``; generate (or reuse) its targets in ``out_dir``."""
    from rift_ada.collectors.collect import CollectSettings
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests

    pair = load_pair(model, dtype=case.dtype)
    requests = load_requests(case.dataset, pair.tokenizer, limit=case.n_requests, max_isl=case.max_isl)
    settings = CollectSettings(
        draft=pair.preset.draft,
        target=pair.preset.target_name,
        temperature=case.temperature,
        seed=case.seed,
        budget=case.budget,
        arm_ages=case.arm_ages,
        dataset=case.dataset,
    )
    targets = ensure_targets(
        pair,
        requests,
        Path(out_dir) / "targets.parquet",
        temperature=case.temperature,
        seed=case.seed,
        max_new_tokens=case.output_tokens,
        min_new_tokens=case.output_tokens,
    )
    return FidelitySetup(pair, requests, settings, targets)


def read_fidelity_case(out_dir: str | Path) -> tuple[FidelityCase, dict[str, Any]]:
    """(case, fidelity.json) of a finished :func:`measure_fidelity` run, without loading any model."""
    import json

    record = json.loads((Path(out_dir) / "fidelity.json").read_text())
    fields = dict(record["case"])
    for key in ("periodic", "arm_ages"):
        fields[key] = tuple(fields[key])
    return FidelityCase(**fields), record


def reopen_fidelity(out_dir: str | Path) -> tuple[FidelityCase, dict[str, Any], FidelitySetup]:
    """(case, fidelity.json, setup) of a finished :func:`measure_fidelity` run (diagnostics rerun parts of it)."""
    case, record = read_fidelity_case(out_dir)
    return case, record, fidelity_setup(out_dir, case, record["model"])


def fidelity_policies(case: FidelityCase, gate: dict[str, Any]) -> dict[str, Any]:
    """Label -> replay spec of the policies a fidelity run measures (labels as its closed loop names them)."""
    return {"stat": "stat", **{periodic_label(i): periodic_label(i) for i in case.periodic}, "gate": gate}


def measure_fidelity(out_dir: str | Path, case: FidelityCase, *, model: str = "smollm2-135m") -> list[dict[str, Any]]:
    """Rows (policy, replay AL and spread, closed AL, relative gap, refreshes both ways); also fidelity.json."""
    from rift_ada.atomic import atomic_write_json, json_safe
    from rift_ada.collectors.collect import closed_results, collect_closed
    from rift_ada.collectors.pipeline import run_collection
    from rift_ada.collectors.trace_io import read_probe_traces

    out = Path(out_dir)
    setup = fidelity_setup(out, case, model)
    pair, requests, settings, targets = setup.pair, setup.requests, setup.settings, setup.targets
    run_collection(pair, requests, targets, out / "probe", settings, mode="probe")
    gate = fidelity_gate(settings, max_age=max(case.arm_ages))
    gate_path = out / "gate.json"
    atomic_write_json(gate_path, gate)
    policies = fidelity_policies(case, gate)
    specs = ["stat", *(periodic_label(interval) for interval in case.periodic), str(gate_path)]  # the gate as a file
    collect_closed(
        pair.draft,
        requests,
        targets,
        out / "closed",
        settings,
        specs,
        target_model=pair.target,
        free_running=case.temperature > 0,
    )
    traces = read_probe_traces(out / "probe")
    closed = closed_results(out / "closed")
    rows = fidelity_rows(traces, closed, policies, case)
    atomic_write_json(out / "fidelity.json", json_safe({"case": case.__dict__, "model": model, "rows": rows}))
    return rows


def fidelity_rows(
    traces: Any, closed: dict[str, dict[str, Any]], policies: dict[str, Any], case: FidelityCase
) -> list[dict[str, Any]]:
    """Per policy (label -> spec, labels as in ``closed``): replay of ``traces`` beside the closed loop."""
    replays = replay_many(traces, list(policies.values()), replicas=case.replicas, seed=case.seed)
    rows = []
    for label, replayed in zip(policies, replays, strict=True):
        totals = closed[label]
        order = [list(map(str, totals["request_id"])).index(str(rid)) for rid in replayed.request_ids]
        closed_al = float(np.mean(np.asarray(totals["al"], dtype=np.float64)[order]))
        closed_refreshes = float(np.sum(np.asarray(totals["refreshes"], dtype=np.float64)[order]))
        rows.append(
            {
                "policy": label,
                "replay_al": replayed.mean_al,
                "replay_al_std": replayed.mean_al_std,
                "closed_al": closed_al,
                "al_gap": (replayed.mean_al - closed_al) / closed_al,
                "replay_refreshes": float(np.sum(replayed.refreshes)),
                "closed_refreshes": closed_refreshes,
            }
        )
    return rows
