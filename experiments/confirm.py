"""Closed-loop confirmation: the calibrated controller's claimed gain measured in the real loop.

Replay chooses the controller and gives a first verdict on the confirmation split; this module
runs, on the same confirmation requests, the chosen controller, the periodic reference Δ and
periodic refresh at the controller's own rate (the matched-rate baseline replay picked) in the
real draft/verify loop (:func:`rift_ada.collectors.collect.collect_closed`), teacher-forced on the
target responses: exact at T = 0, and at T > 0 distributed as free-running rejection sampling
(each drafted position holding token x is accepted with min(1, q(x) / p(x)), the law the
free-running loop follows given its text) while every policy runs on the same text, so the
paired differences carry no text-to-text noise. ``free_running=True`` runs real rejection sampling
instead (each policy commits its own text). The verdict and its paired-bootstrap CIs then come
from the closed-loop per-request totals; replay's figures stay beside them. The result, a
:class:`~rift_ada.calibrate.closed_loop.ClosedConfirmation`, joins the calibration's files through
the model-free :func:`~rift_ada.calibrate.closed_loop.attach_closed_confirmation`.

No model code is imported at import time: :func:`confirm_closed` receives loaded models, and
:func:`confirm_closed_from_traces` (the CLI's entry) imports the loaders when called.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.atomic import json_safe
from rift_ada.calibrate.closed_loop import ClosedConfirmation, attach_closed_confirmation
from rift_ada.calibrate.export import export_controller
from rift_ada.calibrate.pipeline import (
    ROLE_CHOSEN,
    ROLE_MATCHED,
    ROLE_REFERENCE,
    _comparison,
    verdict,
)
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.throughput import CLOSED_BATCH

__all__ = ["confirm_closed", "confirm_closed_from_traces", "settings_from_manifest"]


def _set_aside_if_stale(run_dir: Path, specs: Sequence[str], settings: Any) -> None:
    """A closed run holding other policies belongs to an earlier calibration of the cell: rename it to
    ``closed-superseded-<k>`` (kept, not deleted) so the new plan starts in a fresh directory."""
    from rift_ada.collectors.collect import resolve_closed_policy

    manifest = run_dir / "manifest.json"
    if not manifest.exists():
        return
    labels = [resolve_closed_policy(spec, settings).label for spec in specs]
    if json.loads(manifest.read_text(encoding="utf-8")).get("policies") == labels:
        return
    k = 1
    while (run_dir.parent / f"{run_dir.name}-superseded-{k}").exists():
        k += 1
    run_dir.rename(run_dir.parent / f"{run_dir.name}-superseded-{k}")


def _plan(calibration: Mapping[str, Any], controller: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(replay label, role, closed-loop label) of the chosen controller, the reference and the matched rate."""
    comparisons = calibration["confirmation"]["comparisons"]
    reference, matched = comparisons[0]["baseline"], comparisons[1]["baseline"]
    return [
        ("chosen", ROLE_CHOSEN, str(controller["name"])),
        (reference, ROLE_REFERENCE, reference),
        (matched, ROLE_MATCHED, matched),
    ]


def _closed_entry(totals: Mapping[str, np.ndarray], order: Sequence[str], role: str, label: str) -> dict[str, Any]:
    index = {str(rid): i for i, rid in enumerate(totals["request_id"])}
    missing = [rid for rid in order if rid not in index]
    if missing:
        raise CalibrationError(f"closed-loop run of {label!r} lacks request(s) {missing[:5]}")
    rows = [index[rid] for rid in order]
    al = np.asarray(totals["al"], dtype=np.float64)[rows]
    refreshes = np.asarray(totals["refreshes"], dtype=np.float64)[rows]
    committed = np.asarray(totals["committed"], dtype=np.float64)[rows]
    return {
        "role": role,
        "policy": label,
        "mean_al": float(np.mean(al)),
        "refreshes_per_1k": float(1000.0 * refreshes.sum() / committed.sum()) if committed.sum() else float("nan"),
        "refreshes_total": int(round(refreshes.sum())),
        "committed_total": int(round(committed.sum())),
        "per_request": {"al": al.tolist(), "refreshes": refreshes.tolist(), "committed": committed.tolist()},
    }


def confirm_closed(
    calibration: Mapping[str, Any],
    controller: Mapping[str, Any],
    *,
    draft_model: Any,
    requests: Sequence[Any],
    targets: Any,
    settings: Any,
    out_dir: str | Path,
    target_model: Any | None = None,
    margin: float | None = None,
    n_resamples: int | None = None,
    on_request: Callable[[str, int], None] | None = None,
    on_tokens: Callable[[int, int], None] | None = None,
    extra_policies: Sequence[str] = (),
    batch_size: int = CLOSED_BATCH,
    free_running: bool = False,
    preregistration: Any | None = None,
    extra_requests: Sequence[str] = (),
) -> ClosedConfirmation:
    """Run the chosen controller and its two periodic baselines on the confirmation split in the real loop.

    ``calibration``: the calibration JSON (``calibration.json``); ``controller``: the exported
    controller dict; ``requests`` / ``targets`` / ``settings``: as for ``collect_closed`` (only the
    confirmation requests are run). The closed-loop run lands in ``out_dir``. ``margin`` defaults to
    the calibration's. ``extra_policies`` (e.g. a benchmark's Table 1 methods) run in the same closed
    loop, on the same requests. ``free_running`` (T > 0 only): real rejection sampling instead of
    teacher forcing on the targets. ``on_tokens(tokens, rounds)``: called as the closed loop commits tokens.
    ``preregistration`` (a :class:`~rift_ada.calibrate.curve.Preregistration`): its curve policies (RIFT-stat
    and periodic Δs) run too, and the pre-registered curve verdict is computed from the closed loop.
    ``extra_requests``: ids of confirmation-only requests (never probed nor calibrated on) run beside the split's.
    Returns the closed-loop verdict with paired-bootstrap CIs, replay's beside it.
    """
    from rift_ada.collectors.collect import check_free_running, closed_results, collect_closed

    check_free_running(free_running, settings.temperature)
    conf = calibration["confirmation"]
    wanted = [str(rid) for rid in conf["request_ids"]]
    wanted += [str(rid) for rid in extra_requests if str(rid) not in wanted]
    by_id = {str(request.request_id): request for request in requests}
    missing = [rid for rid in wanted if rid not in by_id]
    if missing:
        raise CalibrationError(f"confirmation request(s) {missing[:5]} are not in the given requests")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    controller_path = export_controller(dict(controller), out / "controller.json")
    plan = _plan(calibration, controller)
    specs: list[str] = []
    for _, _, label in plan:
        spec = str(controller_path) if label == controller["name"] else label
        if spec not in specs:
            specs.append(spec)
    specs += [spec for spec in extra_policies if spec not in specs]
    curve_specs = list(preregistration.curve_policies) if preregistration is not None else []
    specs += [spec for spec in curve_specs if spec not in specs]
    run_dir = out / "closed"
    _set_aside_if_stale(run_dir, specs, settings)
    collect_closed(
        draft_model,
        [by_id[rid] for rid in wanted],
        targets,
        run_dir,
        settings,
        specs,
        target_model=target_model,
        on_request=on_request,
        on_tokens=on_tokens,
        free_running=free_running,
        batch_size=batch_size,
    )
    totals = closed_results(run_dir)
    order = sorted(wanted)
    policies: dict[str, dict[str, Any]] = {}
    closed_entries: dict[str, dict[str, Any]] = {}
    for replay_label, role, closed_label in plan:
        if replay_label in policies:
            policies[replay_label]["role"] += f", {role}"
            continue
        if closed_label not in totals:
            raise CalibrationError(f"closed-loop run has no policy {closed_label!r} (has {sorted(totals)})")
        closed_entries[replay_label] = _closed_entry(totals[closed_label], order, role, closed_label)
        replayed = conf["policies"].get(replay_label, {})
        policies[replay_label] = {
            "role": role,
            "closed_label": closed_label,
            "closed": {k: closed_entries[replay_label][k] for k in ("mean_al", "refreshes_per_1k", "refreshes_total")},
            "replay": {k: replayed.get(k) for k in ("mean_al", "refreshes_per_1k", "refreshes_total")},
        }
    seed = int(conf.get("seed", calibration.get("seed", 0)))
    resamples = int(n_resamples if n_resamples is not None else conf.get("n_resamples", 9999))
    reference_label, matched_label = plan[1][0], plan[2][0]
    comparisons = [
        _comparison(
            "matched AL",
            closed_entries["chosen"],
            reference_label,
            closed_entries[reference_label],
            seed=seed,
            n_resamples=resamples,
        ),
        _comparison(
            "matched refreshes",
            closed_entries["chosen"],
            matched_label,
            closed_entries[matched_label],
            seed=seed,
            n_resamples=resamples,
        ),
    ]
    fraction = float(margin if margin is not None else (conf.get("margin") or {}).get("fraction", 0.01))
    chosen_is_reference = calibration["operating_point"].get("chosen_by") == "reference_baseline"
    decision = verdict(
        comparisons,
        reference_label,
        reference_al=closed_entries[reference_label]["mean_al"],
        margin=fraction,
        chosen_is_reference=chosen_is_reference,
        notes=calibration["operating_point"].get("notes", ()),
        source="closed loop",
    )
    curve = None
    if preregistration is not None:
        from rift_ada.calibrate.curve import PolicyTotals, curve_gap_ci, decide

        def totals_of(label: str, name: str) -> PolicyTotals:
            return PolicyTotals.from_dict(name, _closed_entry(totals[label], order, "", label)["per_request"])

        gap = curve_gap_ci(
            totals_of(str(controller["name"]), "RIFT-ada"),
            [totals_of(spec, spec) for spec in curve_specs],
            n_resamples=preregistration.n_resamples,
            confidence=preregistration.confidence,
            seed=preregistration.seed,
        )
        curve = json_safe(decide(gap, preregistration).to_dict())  # NaN (an undefined reading) as None
    return ClosedConfirmation(
        curve=curve,
        run_dir=str(run_dir),
        free_running=free_running,
        request_ids=order,
        policies=policies,
        comparisons=comparisons,
        verdict=decision,
        replay_verdict=dict(conf["verdict"]),
        seed=seed,
        n_resamples=resamples,
    )


def settings_from_manifest(manifest: Mapping[str, Any]) -> Any:
    """The ``CollectSettings`` a probe collection ran with (so the closed loop runs the same cache)."""
    from rift_ada.collectors.collect import CollectSettings
    from rift_ada.collectors.probe_traces import arm_age

    cache = manifest.get("cache") or {}
    ages = tuple(a for a in (arm_age(name) for name in manifest.get("arms", ())) if a is not None)
    try:
        return CollectSettings(
            draft=str(manifest["draft"]),
            target=str(manifest["target"]),
            temperature=float(manifest["temperature"]),
            seed=int(manifest.get("seed", 0)),
            draft_length=int(manifest["draft_length"]),
            decision_stride=int(manifest["decision_stride"]),
            budget=int(cache["budget"]),
            sw_ratio=float(cache.get("sw_ratio", 0.5)),
            obs_window=int(cache.get("obs_window", 64)),
            block_size=cache.get("block_size"),
            scorer=str(cache.get("scorer", "snapkv")),
            arm_ages=ages or CollectSettings.arm_ages,
            dataset=str(manifest.get("dataset", "embedded")),
        )
    except KeyError as missing:
        raise CalibrationError(f"probe manifest lacks {missing}: cannot rebuild the collection settings") from None


def confirm_closed_from_traces(
    calibration_dir: str | Path,
    traces_dir: str | Path,
    *,
    model: str,
    device: str | None = None,
    targets_path: str | Path | None = None,
    margin: float | None = None,
    on_request: Callable[[str, int], None] | None = None,
    free_running: bool = False,
) -> ClosedConfirmation:
    """Load ``model`` and confirm the calibration in ``calibration_dir`` in the closed loop.

    Requests come from the probe manifest's dataset, targets from ``targets_path`` (default: the
    file ``rift-ada collect`` wrote beside the probe directory, ``<probe>-targets.parquet``), the
    cache settings from the probe manifest; ``device`` defaults to CUDA when available. Attaches the
    result (see :func:`attach_closed_confirmation`).
    """
    from rift_ada.collectors.collect import check_free_running
    from rift_ada.collectors.pipeline import load_pair, load_requests
    from rift_ada.collectors.targets.files import read_targets
    from rift_ada.collectors.trace_io import read_manifest

    folder, traces = Path(calibration_dir), Path(traces_dir)
    targets_file = Path(targets_path) if targets_path else traces.parent / f"{traces.name}-targets.parquet"
    if not targets_file.exists():
        raise CalibrationError(f"{targets_file}: no target responses for the closed-loop confirmation")
    calibration = json.loads((folder / "calibration.json").read_text(encoding="utf-8"))
    controller = json.loads((folder / calibration.get("controller", "controller.json")).read_text(encoding="utf-8"))
    settings = settings_from_manifest(read_manifest(traces))
    check_free_running(free_running, settings.temperature)
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    pair = load_pair(model, device=device)
    requests = load_requests(settings.dataset, pair.tokenizer)
    confirmation = confirm_closed(
        calibration,
        controller,
        draft_model=pair.draft,
        target_model=pair.target,
        requests=requests,
        targets=read_targets(targets_file),
        settings=settings,
        out_dir=folder / "confirm-closed",
        margin=margin,
        on_request=on_request,
        free_running=free_running,
    )
    attach_closed_confirmation(folder, confirmation)
    return confirmation
