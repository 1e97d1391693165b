"""A full disk at any write: one line naming the path (and the option that set it), exit 1, nothing committed
lost or half-written, and a rerun with space ends where an uninterrupted run ends.

Two mechanisms: ``WriteFaults`` makes the Nth ``fsync`` of the write layer fail with ENOSPC (every file
rift-ada writes goes through ``rift_ada.atomic``, which fsyncs it before the rename), and ``small_disk``
mounts a real tmpfs of a few hundred KiB, so SQLite, pyarrow, torch and safetensors meet a real full disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.trace_io import read_tables, write_probe_traces

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class WriteFaults:
    """Counts the write layer's fsyncs; ``fail_at = n``: the n-th raises ENOSPC (as the kernel does: no file name)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fail_at: int | None = None
        real = os.fsync

        def fsync(fd: int) -> None:
            self.calls += 1
            if self.fail_at is not None and self.calls == self.fail_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def arm(self, n: int | None) -> None:
        self.calls, self.fail_at = 0, n


@pytest.fixture
def faults(monkeypatch) -> WriteFaults:
    return WriteFaults(monkeypatch)


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (the tests run as root); skipped where mounting is impossible."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({done.stderr.decode(errors='replace').strip()}); the injected tests remain")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(disk: Path, leave: int) -> Path:
    """Write a filler file so that about ``leave`` bytes stay free on ``disk``; delete it to make room."""
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))
    return filler


def invoke(arguments: list) -> object:
    return CliRunner().invoke(app, [str(a) for a in arguments])


def assert_disk_full_line(result, option: str, under: Path) -> str:
    """Exit 1; the last stderr line is the only error line: a path under ``under``, the full disk, ``option``."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr and "An exception is raised during the commit" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr[-2000:]
    line = errors[0]
    assert "disk is full" in line and f"set by {option}" in line, line
    named = line.removeprefix("error: ").split(": disk is full")[0]
    assert Path(named).is_relative_to(under), line
    return line


def assert_nothing_half_written(folder: Path) -> None:
    """No temporaries left, and every JSON file parses."""
    for path in folder.rglob("*"):
        assert ".tmp-" not in path.name, path
        if path.suffix == ".json" and path.is_file():
            json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------
# calibrate: synthetic probe traces, no model


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> tuple[Path, Path]:
    model = tmp_path_factory.mktemp("model")
    traces = synthetic_traces(12, 256, seed=5, segment_length=64)
    manifest = dict(traces.manifest, draft=str(model), target=str(model), dataset="synthetic", seed=0)
    return model, write_probe_traces(tmp_path_factory.mktemp("traces") / "probe", traces, manifest)


def calibrate_args(probe: tuple[Path, Path], out: Path, trials: int = 0) -> list:
    model, traces = probe
    return ["calibrate", "-m", model, "-t", "0", "--traces", traces, "--out", out, "--trials", trials]


def comparable(path: Path) -> dict:
    """A calibration output without what differs between any two runs: timestamps, wall times, paths."""
    data = json.loads(path.read_text())

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("created", "wall_s", "out_dir", "storage")}
        return [strip(v) for v in value] if isinstance(value, list) else value

    return strip(data)


@pytest.fixture(scope="module")
def calibrated(probe, tmp_path_factory) -> tuple[Path, int]:
    """An uninterrupted calibration (``--out`` only: the controller lands in it) and its number of fsyncs."""
    out = tmp_path_factory.mktemp("calibrated") / "run"
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        real(fd)

    os.fsync = counting
    try:
        result = invoke(calibrate_args(probe, out))
    finally:
        os.fsync = real
    assert result.exit_code == 0, result.output
    return out, len(calls)


def test_calibrate_writes_its_controller_under_out(calibrated):
    out, _ = calibrated
    assert (out / "controller.json").is_file() and not Path("controllers").joinpath("x").exists()
    json.loads((out / "controller.json").read_text())


@pytest.mark.parametrize("point", ["first", "middle", "last"])
def test_calibrate_full_disk_at_a_write_names_it_and_the_rerun_matches(point, faults, probe, calibrated, tmp_path):
    reference, n_writes = calibrated
    out = tmp_path / "run"
    faults.arm({"first": 1, "middle": max(1, n_writes // 2), "last": n_writes}[point])
    assert_disk_full_line(invoke(calibrate_args(probe, out)), "--out", out)
    assert_nothing_half_written(out)
    faults.arm(None)
    result = invoke(calibrate_args(probe, out))
    assert result.exit_code == 0, result.output
    for name in ("calibration.json", "controller.json"):
        assert comparable(out / name) == comparable(reference / name), name
    assert report_text(out) == report_text(reference)


def report_text(out: Path) -> str:
    """report.md without its run folder, creation time and wall times."""
    text = (out / "report.md").read_text().replace(str(out), "<out>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "<created>", text)
    return re.sub(r"\b\d+(\.\d+)? s\b", "<wall> s", text)


def test_explicit_controller_path_is_named_with_its_option(faults, probe, calibrated, tmp_path):
    _, n_writes = calibrated
    controller = tmp_path / "elsewhere" / "c.json"
    faults.arm(n_writes)  # the last write: the controller given by --controller
    line = assert_disk_full_line(
        invoke([*calibrate_args(probe, tmp_path / "run"), "--controller", controller]), "--controller", controller
    )
    assert str(controller) in line


def test_sqlite_study_filling_a_real_disk_is_one_line_and_resumes(probe, tmp_path, monkeypatch):
    import optuna

    import rift_ada.calibrate.pipeline as pipeline
    from rift_ada.calibrate.study import StudyTask

    # A rerun waits one grace period for the trials the failed run left RUNNING: make it short here.
    monkeypatch.setattr(pipeline, "StudyTask", partial(StudyTask, heartbeat_interval=1, grace_period=2))
    with small_disk(tmp_path / "disk", "8m") as disk:
        out = disk / "run"
        filler = fill(disk, 600 * 1024)  # the study's WAL outgrows this within its first trials
        result = invoke(calibrate_args(probe, out, trials=16))
        line = assert_disk_full_line(result, "--out", out)
        assert "study.db" in line, line
        assert not (out / "controller.json").exists()
        filler.unlink()
        result = invoke(calibrate_args(probe, out, trials=16))
        assert result.exit_code == 0, result.output
        storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
        study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        complete = states.count(optuna.trial.TrialState.COMPLETE)
        assert complete == 16 + 7 and optuna.trial.TrialState.RUNNING not in states
        json.loads((out / "controller.json").read_text())
        storage.engine.dispose()


# ----------------------------------------------------------------------------------------------
# targets and collect: the tiny random llama


@pytest.fixture(scope="module")
def collect_reference(tiny_model_dir, tmp_path_factory) -> tuple[list, Path, int]:
    common = ["--model", tiny_model_dir, "--dataset", "embedded:small", "--limit", "3", "--budget", "64"]
    common += ["--arm-ages", "0,16", "--max-new-tokens", "24"]
    out = tmp_path_factory.mktemp("collect") / "traces"
    calls = []
    real = os.fsync
    os.fsync = lambda fd: (calls.append(fd), real(fd))[1]
    try:
        result = invoke(["collect", *common, "--out", out])
    finally:
        os.fsync = real
    assert result.exit_code == 0, result.output
    assert (out / "targets.parquet").is_file()  # without --targets, under --out
    return common, out, len(calls)


@pytest.mark.parametrize("point", ["a part", "last"])  # the targets file: test_targets_on_a_full_tmpfs
def test_collect_full_disk_names_the_file_and_the_rerun_has_the_same_tables(point, faults, collect_reference, tmp_path):
    common, reference, n_writes = collect_reference
    out = tmp_path / "traces"
    faults.arm({"targets": 1, "a part": n_writes // 2, "last": n_writes}[point])
    assert_disk_full_line(invoke(["collect", *common, "--out", out]), "--out", out)
    assert_nothing_half_written(out)
    if (out / "manifest.json").exists():
        read_tables(out)  # what was committed reads back
    faults.arm(None)
    result = invoke(["collect", *common, "--out", out])
    assert result.exit_code == 0, result.output
    tables, expected = read_tables(out), read_tables(reference)
    assert tables.keys() == expected.keys() and all(tables[k].equals(expected[k]) for k in expected)


@pytest.mark.parametrize("leave", [16 * 1024])
def test_targets_on_a_full_tmpfs_names_the_file_and_resumes(leave, tiny_model_dir, tmp_path):
    arguments = ["targets", "--model", tiny_model_dir, "--dataset", "embedded:small", "--limit", "3"]
    arguments += ["--max-new-tokens", "24"]
    reference = tmp_path / "reference.parquet"
    assert invoke([*arguments, "--out", reference]).exit_code == 0
    with small_disk(tmp_path / "disk", "1m") as disk:
        out = disk / "runs" / "targets.parquet"
        filler = fill(disk, leave)
        assert_disk_full_line(invoke([*arguments, "--out", out]), "--out", out.parent)  # the file or its .parts/
        assert not out.exists()
        filler.unlink()
        assert invoke([*arguments, "--out", out]).exit_code == 0
        from rift_ada.collectors.targets.files import read_targets

        assert read_targets(out) == read_targets(reference)


# ----------------------------------------------------------------------------------------------
# train and train-eval


TRAIN = ["--dataset", "embedded", "--n-requests", "6", "--isl-buckets", "256", "--rollout-tokens", "12"]
TRAIN += ["--rollout-temp", "0", "--max-length", "400", "--steps", "3", "--batch-size", "1", "--lora-rank", "2"]
TRAIN += ["--lr", "1e-2", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> Path:
    pytest.importorskip("peft")
    reference = tmp_path_factory.mktemp("trained") / "run"
    result = invoke(["train", "--model", tiny_model_dir, "--out", reference, *TRAIN])
    assert result.exit_code == 0, result.output
    return reference


@pytest.mark.parametrize("leave", [100 * 1024, 8 * 1024 * 1024])  # a checkpoint; the saved model (16 MB)
def test_train_full_disk_resumes_to_the_same_draft(leave, trained, tiny_model_dir, tmp_path):
    import torch

    from rift_ada.models import load_model

    with small_disk(tmp_path / "disk", "48m") as disk:
        out = disk / "run"
        arguments = ["train", "--model", tiny_model_dir, "--out", out, "--targets", trained / "rollouts.parquet"]
        filler = fill(disk, leave)
        assert_disk_full_line(invoke([*arguments, *TRAIN]), "--out", out)
        assert_nothing_half_written(out)
        assert not (out / "model").exists()
        filler.unlink()
        result = invoke([*arguments, *TRAIN])
        assert result.exit_code == 0, result.output
        log = [json.loads(x) for x in (out / "train-log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [1, 2, 3]
        manifest, expected = (json.loads((d / "train.json").read_text()) for d in (out, trained))
        assert (manifest["first_loss"], manifest["last_loss"]) == (expected["first_loss"], expected["last_loss"])
        a, _ = load_model(str(out / "model"))
        b, _ = load_model(str(trained / "model"))
        for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            torch.testing.assert_close(x, y, msg=name)


def test_train_eval_full_disk_resumes_to_the_same_table(trained, tmp_path):
    evaluation = ["train-eval", "--run", trained, "--budgets", "96", "--dyn-interval", "4", "--max-new-tokens", "8"]
    assert invoke([*evaluation, "--out", tmp_path / "eval"]).exit_code == 0
    with small_disk(tmp_path / "disk", "1m") as disk:
        filler = fill(disk, 8 * 1024)
        assert_disk_full_line(invoke([*evaluation, "--out", disk / "eval"]), "--out", disk / "eval")
        assert_nothing_half_written(disk / "eval")
        filler.unlink()
        result = invoke([*evaluation, "--out", disk / "eval"])
        assert result.exit_code == 0, result.output
        assert (disk / "eval" / "eval.md").read_text() == (tmp_path / "eval" / "eval.md").read_text()


# ----------------------------------------------------------------------------------------------
# bench (its resume after an interruption is tested in test_bench.py; here: the line, and nothing half-written)


@pytest.mark.parametrize("n", [6])  # a probe part of the first cell
def test_bench_full_disk_is_one_line_naming_the_file_under_out(n, faults, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    arguments = ["bench", "--size", "tiny", "--model", tiny_model_dir, "--out", out, "--temperatures", "0"]
    faults.arm(n)
    assert_disk_full_line(invoke([*arguments, "--budgets", "96", "--trials", "4"]), "--out", out)
    assert_nothing_half_written(out)
    assert not (out / "bench.json").exists()
