"""`rift-ada bench`: the tiny size end to end (every report section); an interrupted run resumes to the same report."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rift_ada.calibrate.curve import OUTCOMES
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.cli.app import app
from rift_ada.controller import SIGNAL_NAMES
from rift_ada.experiments.bench import BENCH_SIZES, bench_size, run_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SECTIONS = (
    "## What this size can and cannot decide",
    "## Pre-check: is there staleness to refresh for?",
    "### Pre-check (probe traces, replay",
    "## The answer",
    "### Table 1 (closed loop",
    "### The controller against the periodic curve",
    "### Against one periodic reference and periodic at the same rate",
    "### Staleness curve",
    "### Replay fidelity",
    "### Why this outcome",
    "## The paper's findings, checked",
)


@pytest.fixture(scope="module")
def bench_dir(bench_tiny_dir):
    return bench_tiny_dir


def test_tiny_bench_report_has_every_section_and_its_numbers(bench_dir):
    summary = json.loads((bench_dir / "bench.json").read_text())
    report = (bench_dir / "report.md").read_text()
    size = BENCH_SIZES["tiny"]
    assert set(summary["cells"]) == {f"T{t:g} B{b}" for t in size.temperatures for b in size.budgets}
    for section in SECTIONS:
        assert section in report, section
    assert summary["targets"]["T0"]["response_end"] == "eos_or_cap" and "loops" in summary["targets"]["T1"]
    for tag, cell in summary["cells"].items():
        assert f"## {tag}" in report
        assert cell["precheck"]["n_requests"] == summary["n_requests"] and cell["precheck"]["densest"] == "periodic:16"
        assert report.index("### Pre-check") < report.index("### Table 1")
        # Table 1: every method ran in the closed loop on the same requests; full KV is 100% of itself.
        for label in (
            "swa",
            "streamingllm",
            "h2o",
            "snapkv",
            "stat",
            "full",
            cell["controller_name"],
            cell["reference"],
        ):
            assert label in cell["table"], (tag, label)
            assert cell["table"][label]["n_requests"] == len(cell["table_ids"])
        assert cell["table"]["full"]["pct_of_full"] == pytest.approx(1.0)
        assert f"{cell['table']['stat']['mean_al']:.3f}" in report
        # The CI'd comparisons come from the closed loop on every confirmation request; replay's sit beside them.
        confirmation = cell["confirmation"]
        assert confirmation["verdict"]["source"] == "closed loop"
        assert confirmation["n_requests"] == len(cell["confirmation_ids"]) == cell["split_sizes"]["confirmation"]
        assert confirmation["free_running"] is False  # teacher-forced on the targets at every T by default
        assert len(confirmation["replay_comparisons"]) == 2
        assert confirmation["verdict"]["text"] in report
        # Fidelity rows and the oracle frontier are present; the frontier is monotone in refreshes.
        assert cell["fidelity"] and all(row["n_matched"] == len(cell["confirmation_ids"]) for row in cell["fidelity"])
        frontier = [al for al in cell["oracle"]["frontier"]["mean_al"] if al is not None]
        assert frontier == sorted(frontier)
        assert (bench_dir / f"staleness_T{cell['temperature']:g}_B{cell['budget']}.png").stat().st_size > 1000
        # The pre-registered curve verdict: stat + periodic intervals around the controller, the same requests.
        curve = cell["curve"]
        assert curve["outcome"] in OUTCOMES and curve["text"] in report
        assert curve["gap"]["n_requests"] == len(cell["confirmation_ids"])
        assert [p["label"] for p in curve["gap"]["curve"]][0] == "stat" and len(curve["gap"]["curve"]) >= 4
        assert summary["preregistrations"][tag][-1] == cell["preregistration"] == curve["preregistration"]
        assert cell["preregistration"]["confirmation_requests"] == len(cell["confirmation_ids"])
    # The headline gives each cell's pre-registered outcome, and whether each temperature was decided.
    assert re.search(r"T = 0: \*\*(yes|no, underpowered)\*\*", report)
    assert "recovers" not in report and "stat-to-full" not in report
    assert "every policy on the same text" in report  # how the T > 0 cells' closed loop ran


def test_results_page_and_exported_controllers(bench_dir):
    from rift_ada import Controller

    results = (bench_dir.parent / "docs" / "results.md").read_text()
    assert results.startswith("# Results") and "rift-ada bench --size tiny" in results and "## The answer" in results
    assert "(results/staleness_T0_B96.png)" in results  # the plots are copied beside the page
    assert (bench_dir.parent / "docs" / "results" / "staleness_T0_B96.png").stat().st_size > 1000
    summary = json.loads((bench_dir / "bench.json").read_text())
    exported = sorted((bench_dir.parent / "controllers").glob("*.json"))
    engines = [cell["engine_controller"] for cell in summary["cells"].values()]
    assert len(exported) == len(summary["cells"]) + sum(not engine["same_as_best"] for engine in engines)
    for path in exported:
        controller = json.loads(path.read_text())
        Controller.from_dict(controller)  # valid v1 controller
        assert controller["calibration"]["confirmation"]["source"] == "closed loop"
        benchmark = controller["calibration"]["benchmark"]
        assert benchmark["cell"] in summary["cells"] and benchmark["comparisons"]
        cell = summary["cells"][benchmark["cell"]]
        engine = cell["engine_controller"]
        reads_drift = "query_drift" in Controller.from_dict(controller).signals_used
        assert benchmark["engine_feedable"] is not reads_drift
        if benchmark["role"] == "engine":  # beside a best controller that reads query_drift
            assert not reads_drift and controller["name"] == engine["controller_name"]
            assert controller["calibration"]["signals"] == [s for s in SIGNAL_NAMES if s != "query_drift"]
            assert engine["confirmation_ids"] == cell["confirmation_ids"]  # the same held-out requests
            assert benchmark["verdict"] == engine["confirmation"]["verdict"]["text"]
        else:
            assert controller["name"] == cell["controller_name"]
            assert engine["same_as_best"] is not reads_drift
    for cell in summary["cells"].values():  # the results page shows each cell's engine controller
        engine = cell["engine_controller"]
        shown = "shipped for engines as it is" if engine["same_as_best"] else engine["confirmation"]["verdict"]["text"]
        assert "### The engine controller" in results and shown in results


class _Interrupt(Exception):
    pass


def test_results_page_names_the_commit_each_invocation_ran(bench_dir):
    from rift_ada.experiments.bench_report import render_results

    summary = json.loads((bench_dir / "bench.json").read_text())
    summary["source_commit"] = "b" * 40
    summary["invocations"] = [{"wall_s": 5.0, "commit": "a" * 40}, {"wall_s": 1.0, "commit": None},
                              {"wall_s": 2.0, "commit": "b" * 40}]  # fmt: skip
    command_line = render_results(summary, images="results").split("\n")[4]
    assert command_line.startswith("- Command: ") and f"at commit `{'b' * 12}`" in command_line
    assert command_line.endswith(f"; stages read back from earlier invocations ran at `{'a' * 12}`")
    summary["invocations"] = summary["invocations"][-1:]  # one invocation: nothing read back
    assert "earlier invocations" not in render_results(summary, images="results").split("\n")[4]


def test_results_page_names_other_thread_counts_a_run_was_resumed_at(bench_dir, tmp_path):
    import torch

    from rift_ada.experiments.bench import _TimeLedger
    from rift_ada.experiments.bench_report import render_results

    threads = torch.get_num_threads()
    summary = json.loads((bench_dir / "bench.json").read_text())
    summary["invocations"] = [{"wall_s": 5.0, "threads": threads + 2}, {"wall_s": 1.0, "threads": None},
                              {"wall_s": 2.0, "threads": threads}]  # fmt: skip
    machine_line = render_results(summary, images="results").split("\n")[6]
    assert machine_line.startswith("- Machine: ") and f"with {threads} thread(s) (earlier invocations also at " \
        f"{threads + 2}: resumed stages may differ in their last bits" in machine_line  # fmt: skip
    summary["invocations"][0]["threads"] = threads  # every invocation at this count: nothing said
    assert "earlier invocations" not in render_results(summary, images="results").split("\n")[6]
    # the ledger records each invocation's count and names the others
    first = _TimeLedger.open(tmp_path / "timings.json", "a" * 40, threads=3)
    first.write()
    assert first.other_thread_counts() == []
    second = _TimeLedger.open(tmp_path / "timings.json", "a" * 40, threads=1)
    second.write()
    assert second.other_thread_counts() == [3]
    assert [entry["threads"] for entry in json.loads((tmp_path / "timings.json").read_text())["invocations"]] == [3, 1]
    assert _TimeLedger.open(tmp_path / "timings.json", threads=3).other_thread_counts() == [1]


def test_interrupted_bench_resumes_to_the_same_report(bench_dir, tiny_model_dir, tmp_path, caplog):
    import logging

    import torch

    out = tmp_path / "run"

    def stop_at(stage_prefix: str, after: int):
        def progress(stage: str, done: int, total: int | None) -> None:
            if stage.startswith(stage_prefix) and done >= after:
                raise _Interrupt(stage)

        return progress

    # Stopped inside a calibration study, then inside a free-running closed loop, then run to the end.
    with pytest.raises(_Interrupt):
        run_bench(out, size="tiny", model=str(tiny_model_dir), progress=stop_at("T0 B160 calibrate: study", 3))
    with pytest.raises(_Interrupt):
        run_bench(out, size="tiny", model=str(tiny_model_dir), progress=stop_at("T1 B96 closed loop", 1))
    assert (out / "T0" / "B96" / "cell.json").exists() and not (out / "T1" / "B96" / "cell.json").exists()
    ledger = json.loads((out / "timings.json").read_text())
    assert [entry["threads"] for entry in ledger["invocations"]] == [torch.get_num_threads()] * 2
    ledger["invocations"][0]["threads"] = torch.get_num_threads() + 1  # as if begun at another thread count
    (out / "timings.json").write_text(json.dumps(ledger))
    with caplog.at_level(logging.WARNING, logger="rift_ada"):
        run_bench(out, size="tiny", model=str(tiny_model_dir))
    assert f"resuming at {torch.get_num_threads()} torch thread(s), where earlier invocations ran at " in caplog.text
    times = json.loads((out / "bench.json").read_text())
    assert len(times["invocations"]) == 3  # two interrupted, one that finished: each one's time is kept
    assert {entry["commit"] for entry in times["invocations"]} == {times["source_commit"]}  # each one's code
    assert times["untimed_before"] is False
    assert "T0 B96 probe" not in times["timings"] and times["timings_total"]["T0 B96 probe"] > 0  # the first's
    assert times["wall_total_s"] >= times["wall_s"] + times["timings_total"]["T0 B96 probe"] - 0.2
    # the CLI run also made engine controllers (--export-controllers): their sections are its only extra text
    engine_sections = re.compile(r"### The engine controller.*?\n\n(?=### )", re.S)
    assert (out / "report.md").read_text() == engine_sections.sub("", (bench_dir / "report.md").read_text())
    resumed, whole = (json.loads((d / "bench.json").read_text())["cells"] for d in (out, bench_dir))
    for cells in (resumed, whole):
        for cell in cells.values():
            cell.pop("timings")
            cell.pop("controller_path")
            cell["confirmation"].pop("run_dir")
            cell.pop("engine_controller", None)  # made for --export-controllers only (the CLI run)
            cell["oracle"].pop("seconds", None)  # wall time (0.0 vs 0.1 s on a busy host)
    assert resumed == whole


def test_bad_sizes_are_refused_before_any_model_loads(tmp_path):
    with pytest.raises(CalibrationError, match="budgets"):
        bench_size("tiny", budgets=(64,))
    with pytest.raises(CalibrationError, match="max_age"):
        bench_size("full", output_tokens=2048, max_age=1024)
    with pytest.raises(CalibrationError, match="table_requests"):
        bench_size("tiny", table_requests=-1)
    assert bench_size("tiny", table_requests=0).table_requests == 0  # 0: only the confirmation's three policies
    with pytest.raises(CalibrationError, match="unknown bench size"):
        bench_size("huge")
    outcome = CliRunner().invoke(app, ["bench", "--budgets", "128,x", "--out", str(tmp_path / "b")])
    assert outcome.exit_code == 2 and "--budgets" in outcome.stderr
    assert not (tmp_path / "b").exists()


def test_adding_a_budget_or_a_temperature_leaves_finished_cells_done():
    """A cell's fingerprint holds what the cell depends on, not the grid around it: a run continued
    with another budget or temperature reads its finished cells back (also cells whose stored
    fingerprint still records the grid, as before 2026-12-01); a changed setting re-runs them."""
    from rift_ada.atomic import json_safe
    from rift_ada.experiments.bench import _cell_fingerprint, same_cell

    def fingerprint(size):
        return json_safe(_cell_fingerprint(size, 0.0, 96, 0, "tiny", "embedded"))

    alone = fingerprint(bench_size("tiny", budgets=(96,), temperatures=(0.0,)))
    grid = fingerprint(bench_size("tiny", budgets=(96, 160), temperatures=(0.0, 1.0)))
    assert same_cell(alone, grid)
    older = {**grid, "size": {**grid["size"], "budgets": [96], "temperatures": [0.0]}}
    assert same_cell(older, grid)
    assert not same_cell(fingerprint(bench_size("tiny", n_requests=7)), grid)
    # batch sizes say how the work is batched, not what it computes: a cell finished at 8 is read back at 16
    assert same_cell(fingerprint(bench_size("tiny", batch_size=8, probe_batch_size=2)), grid)
    older_batch = {**grid, "size": {**grid["size"], "batch_size": 8}}  # stored before these fields were skipped
    assert same_cell(older_batch, grid)
    assert not same_cell({**grid, "budget": 160}, grid)
    assert not same_cell(None, grid)


def test_more_confirmation_requests_extend_a_finished_run_reusing_every_finished_stage(
    bench_dir, tiny_model_dir, tmp_path
):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(bench_dir, out)
    before = json.loads((out / "bench.json").read_text())

    def snapshot(pattern: str) -> dict[str, int]:
        return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.glob(pattern)) if p.is_file()}

    (out / "timings.json").unlink()  # as a run begun before bench kept its time ledger
    probe, calibration, closed = snapshot("T*/B*/probe/**/*"), snapshot("T*/B*/calibration/study.db"), snapshot(
        "T*/B*/confirm/closed/**/*.parquet"
    )
    assert probe and calibration and closed
    stages: list[str] = []
    committed: dict[str, list[int]] = {}  # stage -> [tokens, rounds] reported as they were committed

    def on_tokens(stage: str):
        totals = committed.setdefault(stage, [0, 0])

        def add(tokens: int, rounds: int) -> None:
            totals[0] += tokens
            totals[1] += rounds

        return add

    run_bench(out, size=bench_size("tiny", confirm_extra=1), model=str(tiny_model_dir),
              progress=lambda stage, done, total: stages.append(stage), token_progress=on_tokens)  # fmt: skip
    assert not [s for s in stages if s.endswith(" probe") or "calibrate: study" in s], stages
    assert snapshot("T*/B*/probe/**/*") == probe and snapshot("T*/B*/calibration/study.db") == calibration
    after_closed = snapshot("T*/B*/confirm/closed/**/*.parquet")
    assert all(after_closed.get(path) == mtime for path, mtime in closed.items())  # finished requests kept
    assert len(after_closed) > len(closed)  # the new request's parts
    summary = json.loads((out / "bench.json").read_text())
    assert summary["untimed_before"] is True and len(summary["invocations"]) == 1  # the earlier one is unknown
    from rift_ada.collectors.collect import closed_results
    from rift_ada.collectors.targets.files import read_targets

    for tag, cell in summary["cells"].items():  # the live token counts are the tokens the new request committed
        temperature, budget = tag.split()
        new_id = cell["extra_ids"][0]
        response = {row["request_id"]: row for row in read_targets(out / temperature / "targets.parquet")}[new_id]
        assert committed[f"{temperature} targets"][0] == len(response["response_token_ids"])
        runs = [data for data in closed_results(out / temperature / budget / "confirm" / "closed").values()]
        new_runs = [(data["committed"][data["request_id"] == new_id], data["rounds"][data["request_id"] == new_id])
                    for data in runs]  # fmt: skip
        assert committed[f"{tag} closed loop: confirmation"] == [
            int(sum(tokens.sum() for tokens, _ in new_runs)),
            int(sum(rounds.sum() for _, rounds in new_runs)),
        ]
    for tag, cell in summary["cells"].items():
        old = before["cells"][tag]
        assert len(cell["extra_ids"]) == 1 and cell["extra_ids"][0] not in old["confirmation_ids"]
        assert cell["confirmation_ids"] == sorted(old["confirmation_ids"] + cell["extra_ids"])
        assert cell["curve"]["gap"]["n_requests"] == len(old["confirmation_ids"]) + 1
        assert cell["controller_name"] == old["controller_name"]
        history = summary["preregistrations"][tag]
        assert [entry["confirmation_requests"] for entry in history] == [len(old["confirmation_ids"]),
                                                                         len(old["confirmation_ids"]) + 1]  # fmt: skip


def test_the_report_names_the_drafts_attention_layout_from_its_preset():
    from rift_ada.experiments.bench_report import _architecture_note

    assert "full-attention model" in _architecture_note("smollm2-135m")
    gemma = _architecture_note("gemma3-270m")
    assert "hybrid draft" in gemma and "3 full attention" in gemma and "full-attention model" not in gemma
    assert "hybrid draft" in _architecture_note("gpt-oss-20b")  # built-in sliding-window layers beside full ones
    assert _architecture_note("/some/local/model") == ""
