"""`rift-ada demo`: the whole pipeline on the embedded default, ending in a report.

Per temperature (T = 0 and T = 1): embedded dataset -> target responses -> probe traces ->
calibration (Optuna over replay, bootstrap confirmation) -> closed-loop runs of every baseline and
the calibrated controller on the held-out confirmation requests (free-running at T > 0) ->
replay-vs-closed fidelity.
Everything lands in one run directory; ``report.md`` is rendered from ``demo.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.calibrate.demo_report import write_demo_report
from rift_ada.calibrate.evaluation import evaluate_run
from rift_ada.calibrate.pipeline import calibrate
from rift_ada.collectors.collect import CollectSettings, closed_results, collect_closed, save_json
from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests, run_collection
from rift_ada.collectors.trace_io import manifest_hash, read_probe_traces

Progress = Callable[[str, int, int | None], None]

# Table 1 rows: (label in the report, closed-loop policy spec; "ada" is the calibrated controller).
TABLE_POLICIES: tuple[tuple[str, str], ...] = (
    ("SWA", "swa"),
    ("StreamingLLM", "streamingllm"),
    ("H2O", "h2o"),
    ("SnapKV", "snapkv"),
    ("RIFT-stat", "stat"),
    ("RIFT-dyn", "periodic"),
    ("RIFT-ada", "ada"),
    ("Full KV", "full"),
)


@dataclass(frozen=True)
class DemoSize:
    """How big a demo run is (requests, output length, study trials, closed-loop coverage)."""

    n_requests: int
    output_tokens: int
    trials: int
    temperatures: tuple[float, ...] = (0.0, 1.0)
    budget: int = 256
    reference_interval: int = 32
    max_isl: int = 1100
    table_at: tuple[float, ...] = (0.0, 1.0)  # temperatures whose closed loop covers every baseline
    repetition_penalty: float = 1.0  # > 1 breaks greedy loops but moves targets off the draft's greedy path
    arm_ages: tuple[int, ...] = (0, 32, 64, 128, 256)


DEMO_SIZES: dict[str, DemoSize] = {
    "tiny": DemoSize(
        n_requests=4, output_tokens=40, trials=16, temperatures=(0.0,), table_at=(0.0,), arm_ages=(0, 16, 32, 48)
    ),
    "small": DemoSize(n_requests=6, output_tokens=112, trials=120, table_at=(0.0,)),
    "full": DemoSize(
        n_requests=24, output_tokens=512, trials=500, reference_interval=64, arm_ages=(0, 32, 64, 128, 256, 512)
    ),
}


def _policies_for(temperature: float, size: DemoSize, controller_path: Path) -> list[str]:
    periodic = f"periodic:{size.reference_interval}"
    if temperature in size.table_at:
        specs = [spec for _, spec in TABLE_POLICIES]
    else:
        specs = ["stat", "periodic", "ada", "full"]
    return [periodic if spec == "periodic" else str(controller_path) if spec == "ada" else spec for spec in specs]


def run_demo(
    out_dir: str | Path,
    *,
    size: str | DemoSize = "small",
    model: str = "smollm2-135m",
    seed: int = 0,
    progress: Progress | None = None,
    dataset: str = "embedded",
    device: str = "cpu",
) -> dict[str, Any]:
    """Run the demo into ``out_dir``; returns the summary (report path, controllers, Table 1)."""
    settings_size = DEMO_SIZES[size] if isinstance(size, str) else size
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = progress or (lambda stage, done, total: None)
    started = time.monotonic()
    report("load model", 0, 1)
    pair = load_pair(model, device=device)
    report("load model", 1, 1)
    requests = load_requests(dataset, pair.tokenizer, limit=settings_size.n_requests, max_isl=settings_size.max_isl)
    if len(requests) < 3:
        raise ValueError(
            f"dataset {dataset!r} gave {len(requests)} requests under ISL {settings_size.max_isl}: need >= 3"
        )
    runs: dict[str, Any] = {}
    controllers: dict[str, str] = {}
    for temperature in settings_size.temperatures:
        tag = f"T{temperature:g}"
        folder = out / tag
        name = f"{pair.preset.name}-{tag}"
        settings = CollectSettings(
            draft=pair.preset.draft,
            target=pair.preset.target_name,
            temperature=temperature,
            seed=seed,
            budget=settings_size.budget,
            arm_ages=settings_size.arm_ages,
            dataset=dataset,
        )

        def tick(stage: str, total: int) -> Callable[[str, int], None]:
            done = [0]
            report(stage, 0, total)

            def step(request_id: str, n_tokens: int) -> None:
                done[0] += 1
                report(stage, done[0], total)

            return step

        targets = ensure_targets(
            pair,
            requests,
            folder / "targets.parquet",
            temperature=temperature,
            seed=seed,
            max_new_tokens=settings_size.output_tokens,
            min_new_tokens=settings_size.output_tokens,
            repetition_penalty=settings_size.repetition_penalty,
            on_request=tick(f"{tag} targets", len(requests)),
        )
        run_collection(
            pair,
            requests,
            targets,
            folder / "probe",
            settings,
            mode="probe",
            on_request=tick(f"{tag} probe", len(requests)),
        )
        traces = read_probe_traces(folder / "probe")

        def calibration_progress(stage: str, done: int, total: int | None, tag: str = tag) -> None:
            report(f"{tag} calibrate: {stage}", done, total)

        result = calibrate(
            traces,
            folder / "calibration",
            name=name,
            draft=pair.preset.draft,
            target=pair.preset.target_name,
            temperature=temperature,
            trials=settings_size.trials,
            seed=seed,
            reference_interval=settings_size.reference_interval,
            manifest_hash=manifest_hash(folder / "probe"),
            progress=calibration_progress,
            log=None,
            cache={"budget": settings_size.budget},
        )
        controller_path = result.controller_path
        controllers[tag] = str(controller_path)
        confirmation_ids = set(result.calibration["confirmation"]["request_ids"])
        held_out = [request for request in requests if request.request_id in confirmation_ids]
        specs = _policies_for(temperature, settings_size, controller_path)
        collect_closed(  # free-running rejection sampling at T > 0: the ground truth replay is judged by
            pair.draft,
            held_out,
            targets,
            folder / "closed",
            settings,
            specs,
            target_model=pair.target,
            on_request=tick(f"{tag} closed loop ({len(specs)} policies)", len(held_out)),
            free_running=temperature > 0,
        )
        closed = closed_results(folder / "closed")
        replay_specs = ["stat", f"periodic:{settings_size.reference_interval}", "full", str(controller_path)]
        evaluation = evaluate_run(folder / "probe", replay_specs, closed_dir=folder / "closed")
        held_out_replay = _held_out_replay(folder / "probe", replay_specs, confirmation_ids)
        runs[tag] = {
            "temperature": temperature,
            "calibration_dir": str(folder / "calibration"),
            "calibration_report": str(result.report_path),
            "controller": str(controller_path),
            "controller_name": result.controller["name"],
            "gain": result.has_gain,
            "verdict": result.calibration["confirmation"]["verdict"],
            "comparisons": result.calibration["confirmation"]["comparisons"],
            "split_sizes": result.split_sizes,
            "reference": f"periodic:{settings_size.reference_interval}",
            "closed": _closed_summary(closed, result.controller["name"], specs),
            "closed_by_position": _closed_by_position(folder / "closed"),
            "fidelity": [row.get("fidelity") for row in evaluation["policies"] if row.get("fidelity")],
            "replay_held_out": held_out_replay,
        }
    summary = {
        "format": "rift-ada.demo",
        "version": 1,
        "model": pair.preset.name,
        "draft": pair.preset.draft,
        "target": pair.preset.target_name,
        "seed": seed,
        "size": asdict(settings_size),
        "dataset": dataset,
        "n_requests": len(requests),
        "isl": [request.isl for request in requests],
        "runs": runs,
        "wall_s": time.monotonic() - started,
    }
    save_json(out / "demo.json", summary)
    report_path = write_demo_report(summary, out)
    return {"report": str(report_path), "controllers": controllers, "table": table_text(summary), "demo": summary}


def _held_out_replay(probe_dir: Path, specs: list[str], request_ids: set[str]) -> list[dict[str, Any]]:
    from rift_ada.policies.evaluate import evaluate_policies

    traces = read_probe_traces(probe_dir)
    keep = [index for index, rid in enumerate(traces.requests["request_id"]) if str(rid) in request_ids]
    rows = evaluate_policies(traces.subset(keep), specs)
    return [{key: row[key] for key in ("policy", "mean_al", "refreshes_per_1k", "al_by_position")} for row in rows]


def _closed_summary(closed: dict[str, dict[str, np.ndarray]], controller_name: str, specs: list[str]) -> list[dict]:
    rows = []
    full_al = float(np.mean(closed["full"]["al"])) if "full" in closed else None
    for label, totals in closed.items():
        mean_al = float(np.mean(totals["al"]))
        committed = float(np.sum(totals["committed"]))
        rows.append(
            {
                "policy": label,
                "is_controller": label == controller_name,
                "mean_al": mean_al,
                "pct_of_full": (mean_al / full_al) if full_al else None,
                "refreshes_per_1k": 1000.0 * float(np.sum(totals["refreshes"])) / committed if committed else None,
                "n_requests": int(len(totals["al"])),
                "per_request_al": [float(x) for x in totals["al"]],
            }
        )
    return rows


def _closed_by_position(closed_dir: Path, bin_size: int = 32) -> dict[str, Any]:
    """Macro AL of rounds starting in each output-position bin, per closed-loop policy (staleness curve)."""
    from rift_ada.collectors.trace_io import read_tables

    table = read_tables(closed_dir, kinds=["rounds"])["rounds"]
    policy = np.asarray(table.column("policy").to_pylist())
    request = np.asarray(table.column("request_id").to_pylist())
    position = np.asarray(table.column("position").to_pylist())
    al = np.asarray(table.column("al").to_pylist(), dtype=float)
    n_bins = int(position.max() // bin_size) + 1 if len(position) else 0
    curves: dict[str, list[float | None]] = {}
    for label in sorted(set(policy.tolist())):
        values = []
        for index in range(n_bins):
            per_request = []
            for rid in sorted(set(request.tolist())):
                mask = (policy == label) & (request == rid) & (position // bin_size == index)
                if mask.any():
                    per_request.append(float(al[mask].mean()))
            values.append(float(np.mean(per_request)) if per_request else None)
        curves[label] = values
    return {"bin_size": bin_size, "curves": curves}


def table_text(summary: dict[str, Any]) -> Any:
    """Table 1 (AL and % of full KV) as a rich table for the terminal."""
    from rich.table import Table

    from rift_ada.calibrate.demo_report import table1_rows

    table = Table(title=f"Closed-loop AL on held-out requests ({summary['model']}, K = 11)")
    table.add_column("method")
    temps = list(summary["runs"])
    for tag in temps:
        table.add_column(f"AL {tag}")
        table.add_column(f"% full {tag}")
    for label, cells in table1_rows(summary):
        row = [label]
        for tag in temps:
            cell = cells.get(tag)
            row += (
                ["-", "-"] if cell is None else [f"{cell['mean_al']:.2f}", f"{100 * (cell['pct_of_full'] or 0):.1f}%"]
            )
        table.add_row(*row)
    return table


def demo_size(name: str, **overrides: Any) -> DemoSize:
    """A named size with some fields replaced (for tests and `--size`)."""
    return replace(DEMO_SIZES[name], **overrides)
