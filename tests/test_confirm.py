"""Closed-loop confirmation: the verdict and its CIs come from the real loop (tiny random model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_models import VOCAB, tiny_model

from rift_ada.calibrate.bootstrap import al_difference_ci
from rift_ada.calibrate.closed_loop import attach_closed_confirmation
from rift_ada.calibrate.config import CalibrationConfig
from rift_ada.calibrate.pipeline import calibrate
from rift_ada.collectors.collect import CollectSettings, closed_results
from rift_ada.collectors.datasets import Request
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.experiments.confirm import confirm_closed

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _job(request_ids: list[str]) -> tuple[list[Request], list[dict]]:
    requests, targets = [], []
    for index, rid in enumerate(request_ids):
        generator = torch.Generator().manual_seed(index)
        prompt = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
        response = torch.randint(0, VOCAB, (24,), generator=generator).tolist()
        requests.append(Request(rid, "synthetic", "cat", "low", [{"role": "user", "content": rid}]))
        targets.append({"request_id": rid, "prompt_token_ids": prompt, "response_token_ids": response})
    return requests, targets


def _calibrated(tmp_path: Path, temperature: float, trials: int, n_resamples: int) -> tuple[CollectSettings, Any]:
    """Tiny collection settings and a calibration on synthetic traces at ``temperature``."""
    settings = CollectSettings(
        draft="tiny", target="tiny", budget=16, obs_window=4, draft_length=4, temperature=temperature
    )
    config = CalibrationConfig(
        name=f"tiny-T{temperature:g}",
        draft="synthetic",
        target="synthetic",
        temperature=temperature,
        trials=trials,
        reference_interval=16,
        n_resamples=n_resamples,
        cache=settings.cache_json(),
    )
    result = calibrate(
        synthetic_traces(12, 48, temperature=temperature, seed=5), tmp_path / "calibration", config, log=None
    )
    return settings, result


def test_closed_loop_confirmation_replaces_the_replay_verdict(tmp_path: Path) -> None:
    settings, result = _calibrated(tmp_path, 0.0, trials=6, n_resamples=500)
    ids = [str(x) for x in result.calibration["confirmation"]["request_ids"]]
    requests, targets = _job(ids + ["not-in-the-split"])
    confirmation = confirm_closed(
        result.calibration,
        result.controller,
        draft_model=tiny_model("llama", seed=4),
        requests=requests,
        targets=targets,
        settings=settings,
        out_dir=tmp_path / "confirm",
        n_resamples=500,
    )
    assert not confirmation.free_running and confirmation.request_ids == sorted(ids)
    totals = closed_results(confirmation.run_dir)
    reference = result.calibration["confirmation"]["comparisons"][0]["baseline"]
    assert set(totals) >= {result.controller["name"], reference}
    assert all(set(map(str, t["request_id"])) == set(ids) for t in totals.values())  # only the split ran
    # The CI is the paired bootstrap of the closed-loop per-request ALs (independently recomputed).
    chosen, base = totals[result.controller["name"]], totals[reference]
    expected = al_difference_ci(chosen["al"], base["al"], n_resamples=500, seed=confirmation.seed)
    got = confirmation.comparisons[0]["al_difference"]
    assert got["estimate"] == pytest.approx(float(np.mean(chosen["al"] - base["al"])))
    assert got["low"] == pytest.approx(expected.low) and got["high"] == pytest.approx(expected.high)
    assert confirmation.verdict["source"] == "closed loop"
    assert confirmation.verdict["margin"]["reference_al"] == pytest.approx(float(np.mean(base["al"])))
    for entry in confirmation.policies.values():  # replay beside the closed loop
        assert entry["replay"]["mean_al"] is not None and entry["closed"]["mean_al"] > 0
    calibration = attach_closed_confirmation(tmp_path / "calibration", confirmation)
    assert calibration["confirmation"]["verdict"] == confirmation.verdict
    assert calibration["confirmation"]["replay_verdict"]["source"] == "replay"
    report = (tmp_path / "calibration" / "report.md").read_text()
    assert "## Closed-loop confirmation" in report and "Verdict source: closed loop" in report
    controller = json.loads((tmp_path / "calibration" / "controller.json").read_text())
    assert controller["calibration"]["confirmation"]["source"] == "closed loop"


def test_t1_confirmation_is_teacher_forced_unless_free_running_is_asked(tmp_path: Path) -> None:
    settings, result = _calibrated(tmp_path, 1.0, trials=4, n_resamples=200)
    ids = [str(x) for x in result.calibration["confirmation"]["request_ids"]]
    requests, targets = _job(ids)
    model = tiny_model("llama", seed=4)
    runs = {}
    for free_running in (False, True):
        out = tmp_path / f"confirm-{free_running}"
        runs[free_running] = confirm_closed(
            result.calibration,
            result.controller,
            draft_model=model,
            requests=requests,
            targets=targets,
            settings=settings,
            out_dir=out,
            n_resamples=200,
            free_running=free_running,
        )
        manifest = json.loads((out / "closed" / "manifest.json").read_text())
        assert runs[free_running].free_running is free_running and manifest["free_running"] is free_running
    # Teacher forcing commits the target's text, so a request's rounds cover its whole response in
    # both modes, but only the free-running loop samples its own tokens: the accepted counts differ.
    forced, free = (closed_results(runs[mode].run_dir) for mode in (False, True))
    name = result.controller["name"]
    assert list(forced[name]["committed"]) == [
        len(t["response_token_ids"]) for t in sorted(targets, key=lambda t: t["request_id"])
    ]
    assert not np.array_equal(forced[name]["rounds"], free[name]["rounds"])


def test_free_running_at_t0_is_refused_before_anything_runs(tmp_path: Path) -> None:
    settings = CollectSettings(draft="tiny", target="tiny", budget=16, obs_window=4, draft_length=4)
    with pytest.raises(ValueError, match="free_running: needs temperature > 0"):
        confirm_closed(
            {},
            {},
            draft_model=None,
            requests=[],
            targets=[],
            settings=settings,
            out_dir=tmp_path / "c",
            free_running=True,
        )
    assert not (tmp_path / "c").exists()


def test_a_closed_run_of_other_policies_is_set_aside_not_resumed(tmp_path):
    """A cell whose calibration re-ran plans other closed-loop policies: the old run is renamed, kept."""
    from rift_ada.experiments.confirm import _set_aside_if_stale

    settings = CollectSettings(draft="d", target="t", temperature=0.0)
    run = tmp_path / "closed"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"policies": ["stat", "periodic:16"]}))
    _set_aside_if_stale(run, ["stat", "periodic:16"], settings)
    assert run.exists()  # the same plan: resumed in place
    _set_aside_if_stale(run, ["stat", "periodic:32"], settings)
    assert not run.exists() and json.loads((tmp_path / "closed-superseded-1" / "manifest.json").read_text())
