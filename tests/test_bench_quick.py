"""Every maintained script in benchmarks/ runs its ``--quick`` mode end to end and writes real figures.

The scripts are found by globbing ``benchmarks/*.py`` (``_``-prefixed helpers and
``benchmarks/investigations/`` are not scripts): a new script without a ``--quick`` mode and a
check here fails :func:`test_every_script_has_a_quick_mode_and_a_check`. The quick modes run in this
process (one torch import for all of them), on the session's tiny random llama; two scripts whose
quick mode has a test file of its own are checked to be run there instead of here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))
# Scripts whose --quick mode another test file runs (with its own checks), so it is not run twice.
COVERED_BY = {"bench_throughput": "test_bench_throughput.py", "fault_injection": "test_faults_quick.py"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_script(stem: str, argv: list[str]) -> int:
    """``benchmarks/<stem>.py``'s ``main(argv)`` in this process (its exit code; None counts as 0).

    The scripts put benchmarks/ on ``sys.path`` and import each other by name: both are undone after.
    """
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location(stem, BENCHMARKS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        code = module.main(argv)
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.path[:] = path
        for name, loaded in list(sys.modules.items()):
            if Path(getattr(loaded, "__file__", None) or "/").parent == BENCHMARKS:
                del sys.modules[name]
    return int(code or 0)


def positive(*values: float) -> bool:
    return all(math.isfinite(value) and value > 0 for value in values)


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# Per script: (arguments after --quick, given the tiny model and a temporary folder; check of that folder).
Check = tuple[Callable[[str, Path], list[str]], Callable[[Path], None]]


def check_batch_controller(out: Path) -> None:
    figures = read(out / "out.json")
    assert set(figures["rows"]) == {"AL + entropies", "AL + entropies + drift"}
    for row in figures["rows"].values():
        assert positive(row["batched_us"], row["by_hand_us"])
        assert row["refreshes"] == row["by_hand_refreshes"] > 0  # batched = one Session per request


def check_calibrate(out: Path) -> None:
    figures = read(out / "out.json")
    assert figures["complete"] >= figures["trials"] == 4
    assert positive(figures["wall_s"], figures["study_s"], figures["replay_s"], figures["positions_per_s"])
    assert figures["study_s"] <= figures["wall_s"]


def check_collect(out: Path) -> None:
    figures = read(out / "out.json")
    (request,) = figures["requests"]
    assert request["osl"] == 32 and request["probe_arms"] == 11 and 1 <= request["closed_al"] <= 12
    for stage in ("probe", "closed"):
        assert positive(figures["medians"][stage]["tok_s"], figures["medians"][stage]["tok_s_cpu"])
    assert positive(figures["target_tok_s"], figures["probe_over_closed_tok_s"])
    assert len(figures["per_repeat_ratios"]) == 2


def check_draft_step(out: Path) -> None:
    figures = read(out / "out.json")
    for clock in ("wall", "cpu"):
        steps = figures[clock]["step_median_s"]
        assert set(steps) == {"budgeted", "full", "plain", "floor"} and positive(*steps.values())
        assert positive(figures[clock]["refresh_median_s"], figures[clock]["budgeted_over_full"])
        assert len(figures[clock]["round_ratios"]) == 3


def check_memory(out: Path) -> None:
    figures = read(out / "out.json")
    default, capped = figures["variants"]["default"], figures["variants"]["capped"]
    assert default["capped"] is False and capped["capped"] is True  # each child set (or kept) its malloc
    assert positive(default["peak_rss_gb"], capped["peak_rss_gb"], figures["wall_ratio"], figures["rss_ratio"])


def check_models(out: Path) -> None:
    (row,) = read(out / "out.json")["models"].values()
    assert positive(row["tokens_per_s"], row["seconds"]) and 1 <= row["mean_al"] <= 12
    assert 0.85 * 256 <= row["isl"] <= 256  # prompts of the ISL bucket


def check_replay(out: Path) -> None:
    figures = read(out / "out.json")
    assert set(figures["replay"]) == {"T=0", "T=1,replicas=4"}
    for table in figures["replay"].values():
        assert set(table["families"]) == {"periodic", "gate", "score"}
        for row in table["families"].values():
            assert positive(row["single_eval_per_s"], row["batched_eval_per_s"]) and 1 <= row["mean_al"] <= 12
    assert positive(figures["controller"]["decide_median_us"], figures["draft_step_ms"])


def check_resume_verify(out: Path) -> None:
    figures = read(out / "out.json")
    assert figures["files"] >= figures["requests"] == 8 and figures["bytes"] > 0
    assert positive(figures["sizes_only_s"], figures["sha256_s"])


def check_selectors(out: Path) -> None:
    from rift_ada.scorers.registry import SCORER_NAMES

    refresh = read(out / "out.json")["refresh_ms"]
    assert set(refresh) == set(SCORER_NAMES) and positive(*refresh.values())


def check_compare_probe(out: Path) -> None:
    (row,) = read(out / "out.json")["rows"]
    assert row["difference"] == 0.0 and row["tokens"] == 16 and row["arms"] > 2  # the current probe vs itself
    assert positive(row["before_s"], row["now_s"])


def check_compare_replay(out: Path) -> None:
    rows = read(out / "out.json")["rows"]
    assert {(row["temperature"], row["family"]) for row in rows} == {
        (t, family) for t in (0.0, 1.0) for family in ("periodic", "gate", "score")
    }
    assert all(positive(row["before_eval_per_s"], row["now_eval_per_s"]) for row in rows)


def check_curve_coverage(out: Path) -> None:
    rows = read(out / "out.json")["rows"]
    assert [(row["n"], row["gap"]) for row in rows] == [(8, 0.0), (8, 0.15)]
    for row in rows:
        assert 0.0 <= row["al_gain"] <= 1.0 and 0.0 <= row["refresh_reduction"] <= 1.0
    assert rows[1]["true_al_gain"] > rows[0]["true_al_gain"]  # the larger gap reads larger


def check_fidelity(out: Path) -> None:
    rows = {row["policy"]: row for row in read(out / "run" / "fidelity.json")["rows"]}
    assert set(rows) == {"stat", "periodic:16", "gate"}
    # T = 0, teacher-forced: a policy that never refreshes walks the probed stat arm exactly.
    assert rows["stat"]["replay_al"] == rows["stat"]["closed_al"] and rows["stat"]["closed_refreshes"] == 0
    assert rows["periodic:16"]["replay_refreshes"] == rows["periodic:16"]["closed_refreshes"] > 0
    assert all(1 <= row["replay_al"] <= 12 and 1 <= row["closed_al"] <= 12 for row in rows.values())


def check_fidelity_forced(out: Path) -> None:
    figures = read(out / "out.json")
    assert figures["case"]["temperature"] == 1.0 and figures["seeds"] == [0, 1]
    rows = {row["policy"]: row for row in figures["rows"]}
    assert set(rows) == {"stat", "periodic:16", "gate"}
    for row in rows.values():
        assert len(row["loop_al_by_seed"]) == 2 and 1 <= row["loop_al"] <= 12 and math.isfinite(row["al_gap"])
    assert {(row["pair"], row["mode"]) for row in figures["pair_spreads"]} == {
        (pair, mode)
        for pair in ("stat - periodic:16", "stat - gate", "periodic:16 - gate")
        for mode in ("teacher-forced", "free-running")
    }


def check_staleness(out: Path) -> None:
    (figures,) = out.glob("*-T0.json")  # <model folder name>-T<temperatures>.json
    (cell,) = read(figures)["model"]["temperatures"].values()
    policies = {run["policy"] for run in cell["runs"]}
    assert policies == {"full", "swa", "snapkv", "rift-stat", "rift-dyn:8", "rift-stat:rho=0.25"}
    assert all(1 <= run["al"] <= 12 and run["rounds"] for run in cell["runs"])
    assert all(run["mass"] for run in cell["runs"] if run["policy"] in ("swa", "snapkv", "rift-stat"))
    page = (out / "page.md").read_text(encoding="utf-8")
    assert page.count("<!-- begin: staleness-models") == 1 and "| rift-dyn:8 |" in page
    assert (out / "results" / "staleness_models_al.png").stat().st_size > 0


def check_table2(out: Path) -> None:
    from rift_ada.scorers.registry import SCORER_NAMES

    figures = read(out / "run" / "table2.json")
    assert figures["command"].endswith("table2_selectors.py --quick --model " + figures["model"] + f" --out {out}/run "
                                       f"--results {out}/page.md")  # fmt: skip
    cells = figures["cells"]
    assert [cell["scorer"] for cell in cells] == list(SCORER_NAMES)
    for cell in cells:
        assert cell["n_requests"] == 2 and 1 <= cell["baseline_al"] <= 12 and 1 <= cell["stat_al"] <= 12
        assert cell["gain_low"] <= cell["gain"] <= cell["gain_high"]
    assert "<!-- end: selectors -->" in (out / "page.md").read_text(encoding="utf-8")


def _json(model_flag: str) -> Callable[[str, Path], list[str]]:
    return lambda model, out: [model_flag, model, "--json", str(out / "out.json")]


CHECKS: dict[str, Check] = {
    "bench_batch_controller": (lambda model, out: ["--json", str(out / "out.json")], check_batch_controller),
    "bench_calibrate": (lambda model, out: ["--json", str(out / "out.json")], check_calibrate),
    "bench_collect": (_json("--preset"), check_collect),
    "bench_draft_step": (_json("--preset"), check_draft_step),
    "bench_memory": (_json("--model"), check_memory),
    "bench_models": (_json("--models"), check_models),
    "bench_replay": (_json("--model"), check_replay),
    "bench_resume_verify": (lambda model, out: ["--json", str(out / "out.json")], check_resume_verify),
    "bench_selectors": (_json("--model"), check_selectors),
    "compare_probe": (_json("--model"), check_compare_probe),
    "compare_replay": (lambda model, out: ["--json", str(out / "out.json")], check_compare_replay),
    "curve_coverage": (lambda model, out: ["--json", str(out / "out.json")], check_curve_coverage),
    "fidelity": (lambda model, out: ["--model", model, "--out", str(out / "run")], check_fidelity),
    "fidelity_forced": (_json("--model"), check_fidelity_forced),
    "staleness_models": (
        lambda model, out: ["--models", model, "--out", str(out), "--results", str(out / "page.md")],
        check_staleness,
    ),
    "table2_selectors": (
        lambda model, out: ["--model", model, "--out", str(out / "run"), "--results", str(out / "page.md")],
        check_table2,
    ),
}


def test_every_script_has_a_quick_mode_and_a_check():
    for stem in SCRIPTS:
        source = (BENCHMARKS / f"{stem}.py").read_text(encoding="utf-8")
        assert '"--quick"' in source, f"benchmarks/{stem}.py has no --quick mode"
    assert set(CHECKS) | set(COVERED_BY) == set(SCRIPTS), "each script needs a check here or a test file of its own"
    assert not set(CHECKS) & set(COVERED_BY)


@pytest.mark.parametrize("stem", sorted(COVERED_BY))
def test_quick_mode_is_run_by_its_own_test_file(stem: str):
    text = (Path(__file__).parent / COVERED_BY[stem]).read_text(encoding="utf-8")
    assert f'/ "benchmarks" / "{stem}.py"' in text and '"--quick"' in text


@pytest.mark.parametrize("stem", sorted(CHECKS))
def test_quick_mode_runs_and_reports(stem: str, tiny_model_dir: Path, tmp_path: Path):
    arguments, check = CHECKS[stem]
    model = str(tiny_model_dir)
    assert run_script(stem, ["--quick", *arguments(model, tmp_path)]) == 0
    check(tmp_path)
