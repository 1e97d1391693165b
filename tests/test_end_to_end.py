"""The whole pipeline through the CLI on a tiny model: dataset -> targets -> probe -> calibrate -> closed loop."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app


@pytest.fixture(scope="module")
def demo_dir(tiny_model_dir, tmp_path_factory):
    """One tiny demo run through the CLI, shared by the tests below."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    arguments = ["demo", "--model", str(tiny_model_dir), "--size", "tiny", "--out", str(out)]
    result = CliRunner().invoke(app, [*arguments, "--dataset", "embedded:small"])
    assert result.exit_code == 0, result.output
    assert "report:" in result.output and "controller (T0)" in result.output
    return out


def test_demo_pipeline_report_matches_json(demo_dir):
    out = demo_dir
    summary = json.loads((out / "demo.json").read_text())
    report = (out / "report.md").read_text()
    run = summary["runs"]["T0"]
    # Every closed-loop row of Table 1 is printed with the AL from demo.json.
    table_lines = [line for line in report.splitlines() if line.startswith("| ")]
    for row in run["closed"]:
        label = {
            "swa": "SWA",
            "streamingllm": "StreamingLLM",
            "h2o": "H2O",
            "snapkv": "SnapKV",
            "stat": "RIFT-stat",
            "full": "Full KV",
            run["reference"]: "RIFT-dyn",
        }.get(row["policy"], "RIFT-ada")
        line = next(line for line in table_lines if line.startswith(f"| {label} |"))
        assert f"{row['mean_al']:.3f}" in line, (label, line)
    # Full KV self-speculation is the ceiling: % of full is 100 for it.
    assert "| Full KV | " in report and "100.0%" in next(line for line in table_lines if line.startswith("| Full KV |"))
    # The controller exported by calibration is a valid v1 controller and was run in the closed loop.
    controller = json.loads((out / "T0" / "calibration" / "controller.json").read_text())
    assert controller["format"] == "rift-ada.controller"
    assert any(row["is_controller"] for row in run["closed"])
    # Fidelity rows compare replay with the closed loop on the same requests.
    assert run["fidelity"] and all(f["n_matched"] == len(run["closed"][0]["per_request_al"]) for f in run["fidelity"])
    for fid in run["fidelity"]:
        assert re.search(re.escape(f"{fid['closed_mean_al']:.3f}"), report)
    assert (out / "staleness_T0.png").stat().st_size > 1000


def test_show_and_evaluate_cli(demo_dir, tmp_path):
    runner = CliRunner()
    out = demo_dir
    controller = out / "T0" / "calibration" / "controller.json"
    shown = runner.invoke(app, ["show", str(controller)])
    assert shown.exit_code == 0 and "policy" in shown.output.lower()
    evaluated = runner.invoke(
        app,
        [
            "evaluate",
            "--traces",
            str(out / "T0" / "probe"),
            "--policy",
            "stat",
            "--policy",
            "full",
            "--closed",
            str(out / "T0" / "closed"),
            "--out",
            str(tmp_path / "eval.json"),
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [row["policy"] for row in data["policies"]] == ["stat", "full"]
    assert data["policies"][0]["fidelity"]["n_matched"] >= 1
    bad = runner.invoke(app, ["show", str(tmp_path / "eval.json")])
    assert bad.exit_code == 1 and "error" in bad.stderr  # a bad file is a runtime error (usage errors are 2)


def test_calibrate_cli_on_demo_traces(demo_dir, tiny_model_dir, tmp_path):
    runner = CliRunner()
    controller = tmp_path / "controller.json"
    common = ["calibrate", "--model", str(tiny_model_dir), "--traces", str(demo_dir / "T0" / "probe")]
    result = runner.invoke(
        app, [*common, "--temp", "0", "--out", str(tmp_path / "run"), "--controller", str(controller), "--trials", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "Confirmation split" in result.output and "splits:" in result.output
    assert json.loads(controller.read_text())["calibration"]["study"]["trials"] == 8
    assert (tmp_path / "run" / "report.md").exists()
    refused = runner.invoke(app, [*common, "--temp", "1", "--out", str(tmp_path / "other")])
    assert refused.exit_code == 2 and "temperature" in refused.output
