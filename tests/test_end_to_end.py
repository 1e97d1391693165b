"""The whole pipeline through the CLI on a tiny model: dataset -> targets -> probe -> calibrate -> closed loop."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app


@pytest.fixture(scope="module")
def demo_dir(bench_tiny_dir):
    """The tiny benchmark run (`rift-ada demo` is the benchmark at the small size); its T = 0, B = 96 cell."""
    return bench_tiny_dir / "T0" / "B96"


def test_demo_is_the_benchmark_and_its_table_matches_the_json(bench_tiny_dir, tiny_model_dir, tmp_path):
    # `rift-ada demo` on a finished run directory of the same size reads every cell back: same report.
    out = tmp_path / "demo"
    shutil.copytree(bench_tiny_dir, out)
    cells = sorted(out.glob("T*/B*/cell.json"))
    before = [(path.stat().st_mtime_ns, path.read_bytes()) for path in cells]
    result = CliRunner().invoke(app, ["demo", "--model", str(tiny_model_dir), "--size", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "report:" in result.output
    assert len(cells) == 4 and [(path.stat().st_mtime_ns, path.read_bytes()) for path in cells] == before
    report = (out / "report.md").read_text()
    assert report == (bench_tiny_dir / "report.md").read_text()
    summary = json.loads((out / "bench.json").read_text())
    cell = summary["cells"]["T0 B96"]
    section = report.split("## T0 B96", 1)[1].split("## T0 B160", 1)[0]
    table_1 = section.split("### Table 1", 1)[1].split("### ", 1)[0]  # the pre-check above has a RIFT-stat row too
    table_lines = [line for line in table_1.splitlines() if line.startswith("| ")]
    labels = {"swa": "SWA", "streamingllm": "StreamingLLM", "h2o": "H2O", "snapkv": "SnapKV", "stat": "RIFT-stat"}
    labels |= {"full": "Full KV", cell["reference"]: "RIFT-dyn Δ = 16"}
    labels[cell["controller_name"]] = "RIFT-ada (calibrated)"
    for policy, label in labels.items():
        line = next(line for line in table_lines if line.startswith(f"| {label} |"))
        assert f"{cell['table'][policy]['mean_al']:.3f}" in line, (label, line)
    assert "100.0%" in next(line for line in table_lines if line.startswith("| Full KV |"))
    for fid in cell["fidelity"]:
        assert re.search(re.escape(f"{fid['closed_mean_al']:.3f}"), section)


def test_show_and_evaluate_cli(demo_dir, tmp_path):
    runner = CliRunner()
    out = demo_dir
    controller = out / "calibration" / "controller.json"
    shown = runner.invoke(app, ["show", str(controller)])
    assert shown.exit_code == 0 and "policy" in shown.output.lower()
    evaluated = runner.invoke(
        app,
        [
            "evaluate",
            "--traces",
            str(out / "probe"),
            "--policy",
            "stat",
            "--policy",
            "full",
            "--closed",
            str(out / "confirm" / "closed"),  # the confirmation's curve ran stat here (Table 1 reads it back)
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
    common = ["calibrate", "--model", str(tiny_model_dir), "--traces", str(demo_dir / "probe")]
    result = runner.invoke(
        app, [*common, "--temp", "0", "--out", str(tmp_path / "run"), "--controller", str(controller), "--trials", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "Confirmation split" in result.output and "splits:" in result.output
    assert json.loads(controller.read_text())["calibration"]["study"]["trials"] == 8
    assert (tmp_path / "run" / "report.md").exists()
    refused = runner.invoke(app, [*common, "--temp", "1", "--out", str(tmp_path / "other")])
    assert refused.exit_code == 2 and "temperature" in refused.output
