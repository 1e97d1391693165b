"""Before/after evaluation of trained drafts in rift-ada's own closed loop (paper Table 5 / 6 shape).

Every draft (the untrained one and each trained run) drafts for the *same frozen target* on the
held-out requests of the training split: full KV once, RIFT-stat and RIFT-dyn (periodic refresh
every Δ tokens) at each budget, T = 0 teacher-forced on the target's greedy responses unless a
temperature is given. Gains are relative AL improvements over the untrained draft (and over a
reference run, e.g. no-mask KD), with paired-bootstrap CIs over requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.atomic import atomic_write_json, atomic_write_text, json_safe
from rift_ada.calibrate.bootstrap import _paired_interval
from rift_ada.collectors.collect import CollectSettings, closed_results, collect_closed
from rift_ada.collectors.pipeline import ensure_targets, load_pair
from rift_ada.models import load_model
from rift_ada.policy_spec import DYN, PolicySpec, periodic_label
from rift_ada.scorers.registry import check_scorer
from rift_ada.train.config import TrainConfig
from rift_ada.train.data import load_training_requests

UNTRAINED = "untrained"


@dataclass(frozen=True)
class EvalSettings:
    """What the evaluation runs: budgets, RIFT-dyn interval, closed-loop settings, bootstrap."""

    budgets: tuple[int, ...] = (128, 256, 512)
    dyn_interval: int = 64
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 256
    sw_ratio: float = 0.5
    obs_window: int = 64
    scorer: str = "snapkv"  # prefill scorer of RIFT-stat / RIFT-dyn (rift_ada.scorers.registry)
    draft_length: int = 11
    n_resamples: int = 9999
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not self.budgets or any(b < self.obs_window for b in self.budgets):
            raise ValueError(
                f"budgets must be a non-empty list of integers >= the observation window {self.obs_window}, "
                f"got {list(self.budgets)}"
            )
        if self.dyn_interval < 1:
            raise ValueError(f"dyn interval must be >= 1, got {self.dyn_interval}")
        check_scorer(self.scorer, "scorer")


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """A training run's manifest (``train.json``), checked to have a saved draft."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "train.json"
    if not manifest_path.is_file():
        raise ValueError(f"{run_dir}: no train.json (not a finished `rift-ada train` run)")
    manifest = json.loads(manifest_path.read_text())
    if not (run_dir / "model" / "config.json").is_file():
        raise ValueError(f"{run_dir}/model: no saved draft")
    return manifest


def _relative_gain(ctl: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    """mean(ctl) / mean(base) - 1 (macro AL over requests), paired by request."""
    return np.mean(ctl, axis=axis) / np.mean(base, axis=axis) - 1.0


def policy_rows(settings: EvalSettings) -> list[tuple[str, str, int | None]]:
    """(method name, closed-loop policy label, budget or None for full KV) in table order."""
    rows: list[tuple[str, str, int | None]] = [("Full KV", "full", None)]
    rows += [("RIFT-stat", "stat", budget) for budget in settings.budgets]
    dyn = periodic_label(settings.dyn_interval)  # the closed loop's label of dyn:N
    rows += [(f"RIFT-dyn (Δ={settings.dyn_interval})", dyn, budget) for budget in settings.budgets]
    return rows


def _run_draft(
    model: Any,
    target: Any,
    requests: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    settings: EvalSettings,
    names: tuple[str, str],
    dataset: str,
    on_request: Callable[[str, int], None] | None,
) -> dict[tuple[str, int | None], dict[str, float]]:
    """Per (policy label, budget): request id -> AL of one draft."""
    results: dict[tuple[str, int | None], dict[str, float]] = {}
    for index, budget in enumerate(settings.budgets):
        collect = CollectSettings(
            draft=names[0],
            target=names[1],
            temperature=settings.temperature,
            seed=settings.seed,
            draft_length=settings.draft_length,
            budget=budget,
            sw_ratio=settings.sw_ratio,
            obs_window=settings.obs_window,
            scorer=settings.scorer,
            dataset=dataset,
        )
        policies = ["stat", PolicySpec(DYN, interval=settings.dyn_interval).label] + (["full"] if index == 0 else [])
        run_dir = out_dir / f"B{budget}"
        collect_closed(model, requests, rows, run_dir, collect, policies, target_model=target, on_request=on_request)
        for label, totals in closed_results(run_dir).items():
            key = (label, None) if label == "full" else (label, budget)
            results[key] = dict(zip(totals["request_id"].tolist(), totals["al"].tolist(), strict=True))
    return results


def evaluate_runs(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    settings: EvalSettings,
    *,
    labels: Sequence[str] | None = None,
    reference: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    on_request: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """AL of the untrained draft and of each run's trained draft on the runs' held-out requests."""
    out_dir = Path(out_dir)
    manifests = [read_run(run) for run in run_dirs]
    labels = list(labels or [Path(run).name for run in run_dirs])
    if len(labels) != len(run_dirs) or len(set(labels) | {UNTRAINED}) != len(labels) + 1:
        raise ValueError(f"labels {labels} must be unique, one per run, and not {UNTRAINED!r}")
    if reference is not None and reference not in labels:
        raise ValueError(f"reference {reference!r} is not one of the run labels {labels}")
    first = TrainConfig.from_dict(manifests[0]["config"])
    for run, manifest in zip(run_dirs, manifests, strict=True):
        config = TrainConfig.from_dict(manifest["config"])
        same = (config.model, config.dataset, config.n_requests, config.isl_buckets)
        if same != (first.model, first.dataset, first.n_requests, first.isl_buckets):
            raise ValueError(f"{run}: trained from another model or dataset than {run_dirs[0]}")
        if manifest["split"]["eval"] != manifests[0]["split"]["eval"]:
            raise ValueError(f"{run}: held-out requests differ from {run_dirs[0]}'s (another seed or eval fraction)")
    pair = load_pair(first.model, device=device, dtype=dtype)
    target = pair.target_for_generation
    held_out = set(manifests[0]["split"]["eval"])
    requests = [
        request
        for request in load_training_requests(
            first.dataset, pair.tokenizer, n_requests=first.n_requests, isl_buckets=first.isl_buckets
        )
        if request.request_id in held_out
    ]
    rows = ensure_targets(
        pair,
        requests,
        out_dir / "eval-targets.parquet",
        temperature=settings.temperature,
        seed=settings.seed,
        max_new_tokens=settings.max_new_tokens,
    )
    names = (pair.preset.draft, pair.preset.target_name)
    per_draft = {
        UNTRAINED: _run_draft(
            pair.draft, target, requests, rows, out_dir / UNTRAINED, settings, names, first.dataset, on_request
        )
    }
    for label, run in zip(labels, run_dirs, strict=True):
        model, _ = load_model(str(Path(run) / "model"), device=device, dtype=dtype)
        per_draft[label] = _run_draft(
            model,
            target,
            requests,
            rows,
            out_dir / label,
            settings,
            (str(Path(run) / "model"), names[1]),
            first.dataset,
            on_request,
        )
        del model
    result = summarize(per_draft, settings, labels, reference)
    result.update({"runs": [str(run) for run in run_dirs], "requests": sorted(held_out), "settings": settings.__dict__})
    atomic_write_json(out_dir / "eval.json", json_safe(result))
    atomic_write_text(out_dir / "eval.md", result["markdown"])
    return result


def summarize(
    per_draft: dict[str, dict[tuple[str, int | None], dict[str, float]]],
    settings: EvalSettings,
    labels: Sequence[str],
    reference: str | None,
) -> dict[str, Any]:
    """Mean AL per draft and row, relative gains with paired-bootstrap CIs, and a markdown table."""
    comparisons = [(label, UNTRAINED) for label in labels]
    comparisons += [(label, reference) for label in labels if reference is not None and label != reference]
    table = []
    for method, policy, budget in policy_rows(settings):
        key = (policy, budget)
        ids = sorted(per_draft[UNTRAINED][key])
        row: dict[str, Any] = {"method": method, "policy": policy, "budget": budget, "al": {}, "gain": {}}
        for label, values in per_draft.items():
            row["al"][label] = float(np.mean([values[key][rid] for rid in ids]))
        for label, base in comparisons:
            ctl = np.array([per_draft[label][key][rid] for rid in ids])
            ref = np.array([per_draft[base][key][rid] for rid in ids])
            interval = _paired_interval(
                _relative_gain,
                ctl,
                ref,
                n_resamples=settings.n_resamples,
                confidence=settings.confidence,
                seed=settings.seed,
            )
            row["gain"][f"{label} vs {base}"] = interval.to_dict()
        table.append(row)
    return {"table": table, "n_requests": len(ids), "markdown": _markdown(table, list(per_draft), comparisons)}


def _pct(interval: dict[str, Any]) -> str:
    low, high = interval["low"], interval["high"]
    ci = "" if not (np.isfinite(low) and np.isfinite(high)) else f" [{100 * low:+.1f}, {100 * high:+.1f}]"
    return f"{100 * interval['estimate']:+.2f}%{ci}"


def _markdown(table: list[dict[str, Any]], drafts: list[str], comparisons: list[tuple[str, str]]) -> str:
    header = ["method", "budget", *[f"AL {d}" for d in drafts], *[f"{a} vs {b}" for a, b in comparisons]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table:
        cells = [row["method"], "full" if row["budget"] is None else str(row["budget"])]
        cells += [f"{row['al'][d]:.3f}" for d in drafts]
        cells += [_pct(row["gain"][f"{a} vs {b}"]) for a, b in comparisons]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
