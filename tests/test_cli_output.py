"""CLI output for people and scripts: --json, tables that never cut what a user must type, progress in logs."""

from __future__ import annotations

import copy
import io
import json
import typing

from rich.console import Console
from test_cli_errors import imported, invoke, model_dir, no_model_loads, probe_dir  # noqa: F401
from test_controller_validation import valid_examples

from rift_ada.cli._progress import ProgressReporter
from rift_ada.collectors.datasets import list_datasets
from rift_ada.models import PRESETS


def test_models_and_datasets_print_full_names_and_json():
    table, _ = invoke(["models"])  # CliRunner's stdout is not a terminal, like `rift-ada models | cat`
    assert table.exit_code == 0
    for preset in PRESETS.values():
        assert preset.name in table.stdout and preset.draft in table.stdout
        assert preset.target is None or preset.target in table.stdout
    listed, _ = invoke(["models", "--json"])
    assert [row["name"] for row in json.loads(listed.stdout)] == list(PRESETS)
    table, _ = invoke(["datasets"])
    names = [entry["name"] for entry in list_datasets()]
    assert all(name in table.stdout for name in names)
    listed, _ = invoke(["datasets", "--json"])
    assert [row["name"] for row in json.loads(listed.stdout)] == names


def test_evaluate_prints_policy_names_whole_and_json(probe_dir, tmp_path):  # noqa: F811
    controller = copy.deepcopy(valid_examples()[2])  # periodic
    controller["name"] = "a-long-controller-name-that-a-user-copies-into-scripts-[v2]"
    controller["temperature"] = 0.0
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(controller))
    arguments = ["evaluate", "--traces", probe_dir, "--policy", "periodic:64", "--policy", "stat", "--policy", path]
    table, _ = invoke(arguments)
    assert table.exit_code == 0, table.output
    assert "periodic:64" in table.stdout and controller["name"] in table.stdout
    as_json, _ = invoke([*arguments, "--json"])
    rows = json.loads(as_json.stdout)["policies"]
    assert [row["policy"] for row in rows] == ["periodic:64", "stat", controller["name"]]
    table_al = [line for line in table.stdout.splitlines() if "periodic:64" in line][0]
    assert f"{rows[0]['mean_al']:.3f}" in table_al


def test_calibrate_json_and_progress_lines(probe_dir, model_dir, tmp_path):  # noqa: F811
    controller = tmp_path / "controller.json"
    arguments = ["calibrate", "-m", model_dir, "-t", "0", "--traces", probe_dir, "--out", tmp_path / "run",
                 "--controller", controller, "--trials", "6", "--json"]  # fmt: skip
    result, _ = invoke(arguments)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds the JSON only; progress went to stderr
    assert data["controller"] == str(controller) and controller.exists()
    assert data["confirmation"]["comparisons"] and "splits" in data
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert any(line.startswith("[study] ") for line in progress)
    assert progress[-1].endswith("done")


def test_progress_in_a_log_is_one_line_per_request_with_rate_and_eta(monkeypatch):
    clock = iter([0.0, 2.0, 4.0, 6.0])
    monkeypatch.setattr("rift_ada.cli._progress.time.monotonic", lambda: next(clock))
    buffer = io.StringIO()
    with ProgressReporter(Console(file=buffer, width=200), live=False, min_interval=0) as progress:
        finished = progress.request_callback("targets", 3)
        for request_id in ("a", "b", "c"):
            finished(request_id, 100)
    lines = buffer.getvalue().splitlines()
    assert lines == [
        "[targets] 1/3 requests (33%) | 0.50 requests/s | 50.0 tok/s | elapsed 2s | ETA 4s",
        "[targets] 2/3 requests (67%) | 0.50 requests/s | 50.0 tok/s | elapsed 4s | ETA 2s",
        "[targets] 3/3 requests (100%) | 0.50 requests/s | 50.0 tok/s | elapsed 6s | done",
    ]


def test_fast_stages_are_throttled_but_always_finish():
    buffer = io.StringIO()
    with ProgressReporter(Console(file=buffer, width=200), live=False, min_interval=3600) as progress:
        report = progress.stage_callback()
        for done in range(1, 101):
            report("study", done, 100)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[study] 1/100") and lines[1].startswith("[study] 100/100")


def test_bench_sizes_match_the_library():
    from rift_ada.cli.bench import BenchSizeName
    from rift_ada.experiments.bench import BENCH_SIZES

    assert set(typing.get_args(BenchSizeName)) == set(BENCH_SIZES)


def test_docs_cli_md_is_generated_from_the_app():
    from pathlib import Path

    from rift_ada.cli.reference import CONVENTIONS, cli_reference

    docs = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    assert docs.read_text() == CONVENTIONS + cli_reference(), "run make docs"


def test_bars_on_a_terminal():
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True)
    with ProgressReporter(console) as progress:
        assert progress.live
        finished = progress.request_callback("collect [probe]", 2)  # markup-like names stay text
        finished("a", 10)
        finished("b", 10)
        progress.stage_callback()("study", 5, None)
    shown = buffer.getvalue()
    assert "collect [probe]" in shown and "2/2" in shown


def test_calibrate_signals_subset_for_an_engine_without_query_summaries(probe_dir, model_dir, tmp_path):  # noqa: F811
    from rift_ada.controller import Controller

    controller = tmp_path / "controller.json"
    arguments = ["calibrate", "-m", model_dir, "-t", "0", "--traces", probe_dir, "--out", tmp_path / "run",
                 "--controller", controller, "--trials", "6", "--json", "--signals", "acceptance, entropy"]  # fmt: skip
    result, _ = invoke(arguments)
    assert result.exit_code == 0, result.output
    assert set(Controller.load(controller).signals_used) <= {"acceptance", "entropy"}
    calibration = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert calibration["signals"] == ["acceptance", "entropy"]


def test_committed_tokens_move_the_line_between_finished_requests(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0])
    monkeypatch.setattr("rift_ada.cli._progress.time.monotonic", lambda: next(clock))
    buffer = io.StringIO()
    with ProgressReporter(Console(file=buffer, width=200), live=False, min_interval=0, token_interval=0) as progress:
        finished = progress.request_callback("collect closed", 2)
        committed = progress.tokens_callback("collect closed", 2)
        committed(30, 8)  # two rounds of four runs, no request finished yet
        committed(10, 4)
        finished("a", 40)  # the request's tokens were already counted as they were committed
        finished("b", 40)
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("[collect closed] 0/2 requests (0%) | 30 tokens, 8 rounds | 0.00 requests/s | 30.0 tok")
    assert lines[1].startswith("[collect closed] 0/2 requests (0%) | 40 tokens, 12 rounds")
    assert lines[2].startswith("[collect closed] 1/2 requests (50%) | 40 tokens, 12 rounds")
    assert lines[3].startswith("[collect closed] 2/2 requests (100%) | 40 tokens, 12 rounds")
    assert lines[3].endswith("done")


def test_lines_that_only_tokens_moved_are_throttled_in_a_log(monkeypatch):
    clock = iter([0.0, 1.0, 5.0, 11.0, 12.0, 13.0])
    monkeypatch.setattr("rift_ada.cli._progress.time.monotonic", lambda: next(clock))
    buffer = io.StringIO()
    with ProgressReporter(Console(file=buffer, width=200), live=False, min_interval=0, token_interval=10) as progress:
        finished = progress.request_callback("probe", 2)
        committed = progress.tokens_callback("probe", 2)
        committed(10, 1)  # t = 1: the stage's first line
        committed(10, 1)  # t = 5: tokens only, 4 s after the last line: throttled
        committed(10, 1)  # t = 11: 10 s after the last line: printed, with every token so far
        committed(10, 1)  # t = 12: throttled
        finished("a", 40)  # t = 13: a finished request always prints
    lines = buffer.getvalue().splitlines()
    moved = [line.split(" | ")[1] for line in lines]
    assert moved == ["10 tokens, 1 rounds", "30 tokens, 3 rounds", "40 tokens, 4 rounds"]
    assert lines[-1].startswith("[probe] 1/2 requests (50%)")
