"""Bad input fails fast and plainly: options checked before any model loads, one line on stderr, exit 2 or 1."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
from test_controller_validation import valid_examples
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.trace_io import write_probe_traces
from rift_ada.controller import MAX_CONTROLLER_BYTES


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Any model, tokenizer or pair load fails the test: bad options must be refused before."""

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    import rift_ada.collectors.pipeline as pipeline
    import rift_ada.models as models

    for module, name in ((models, "load_model"), (models, "load_tokenizer"), (pipeline, "load_pair"),
                         (pipeline, "load_model")):  # fmt: skip
        monkeypatch.setattr(module, name, loaded)


@pytest.fixture(scope="module", autouse=True)
def imported() -> None:
    """Import what the commands import once, so the timings measure the checks (not a cold import on 2 busy cores)."""
    import rift_ada.calibrate.pipeline  # noqa: F401
    import rift_ada.collectors.collect  # noqa: F401
    import rift_ada.policies.evaluate  # noqa: F401


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A local "model directory" name (never loaded): local paths resolve to an ad-hoc preset."""
    return tmp_path_factory.mktemp("model")


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory, model_dir) -> Path:
    """A small probe trace directory for that model at T = 0 (synthetic traces, no model)."""
    traces = synthetic_traces(12, 256, seed=5, segment_length=64)
    manifest = dict(traces.manifest, draft=str(model_dir), target=str(model_dir), dataset="synthetic", seed=0)
    return write_probe_traces(tmp_path_factory.mktemp("traces") / "probe", traces, manifest)


def invoke(arguments: list[str]):
    start = time.monotonic()
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    return result, time.monotonic() - start


def assert_usage_error(arguments: list[str], option: str) -> None:
    result, seconds = invoke(arguments)
    assert result.exit_code == 2, (arguments, result.output, result.exception)
    assert result.stdout == ""
    assert f"Invalid value for '{option}'" in result.stderr or f"'{option}'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert seconds < 3, (arguments, seconds)


BAD_OPTIONS = [
    (["collect", "--budget", "0"], "--budget"),
    (["collect", "--budget", "16"], "--budget"),  # smaller than the observation window
    (["collect", "--mode", "probes"], "--mode"),
    (["collect", "--shard", "5/2"], "--shard"),
    (["collect", "--shard", "half"], "--shard"),
    (["collect", "--model", "no-such-preset"], "--model"),
    (["collect", "--arm-ages", "0,5"], "--arm-ages"),
    (["collect", "--arm-ages", "0,x"], "--arm-ages"),
    (["collect", "--arm-ages", "64,32"], "--arm-ages"),
    (["collect", "--sw-ratio", "0"], "--sw-ratio"),
    (["collect", "--sw-ratio", "1.5"], "--sw-ratio"),
    (["collect", "--block-size", "0"], "--block-size"),
    (["collect", "--mode", "closed"], "--policy"),
    (["collect", "--mode", "closed", "--policy", "stat", "--probe-batch-size", "4"], "--probe-batch-size"),
    (["collect", "--probe-batch-size", "0"], "--probe-batch-size"),
    (["collect", "--mode", "closed", "--policy", "bogus"], "--policy"),
    (["collect", "--mode", "closed", "--policy", "periodic:0"], "--policy"),
    (["collect", "--mode", "closed", "--policy", "stat", "--policy", "stat"], "--policy"),
    (["collect", "--policy", "stat"], "--policy"),
    (["collect", "--limit", "0"], "--limit"),
    (["collect", "--temp", "-1"], "--temp"),
    (["collect", "--dataset", "prompts.csv"], "--dataset"),
    (["collect", "--dataset", "jsonl:/no/such/prompts.jsonl"], "--dataset"),
    (["targets", "--limit", "0"], "--limit"),
    (["targets", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["targets", "--min-new-tokens", "9", "--max-new-tokens", "8"], "--min-new-tokens"),
    (["targets", "--import", "/no/such/responses.jsonl"], "--import"),
    (["demo", "--size", "huge"], "--size"),
    (["demo", "--seed", "-1"], "--seed"),
    (["collect", "--seed", str(2**31)], "--seed"),
    (["collect", "--budget", "9" * 5000], "--budget"),
    (["demo", "--model", "no-such-preset"], "--model"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--trials", "-1"], "--trials"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--workers", "0"], "--workers"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--timeout", "0"], "--timeout"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--reference-interval", "0"], "--reference-interval"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--traces", "/no/such/traces"], "--traces"),
    (["calibrate", "-m", "smollm2-135m", "-t", "1", "--free-running"], "--free-running"),  # without --confirm closed
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--confirm", "closed", "--free-running"], "--free-running"),
    (["evaluate", "--traces", "/no/such/traces"], "--traces"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--signals", "acceptance,qurey_drift"], "--signals"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--signals", ","], "--signals"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--signals", "entropy,entropy"], "--signals"),
    (["calibrate", "-m", "smollm2-135m", "-t", "0", "--block-size", "0"], "--block-size"),
]


@pytest.mark.parametrize(("arguments", "option"), BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_fail_fast_without_loading_a_model(arguments, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written outside
    assert_usage_error(arguments, option)


def test_trace_directory_options_are_checked(probe_dir, model_dir, tmp_path):
    assert_usage_error(["evaluate", "--traces", probe_dir, "--closed", probe_dir], "--closed")  # was a KeyError
    assert_usage_error(["evaluate", "--traces", probe_dir, "--policy", "periodic:x"], "--policy")
    other_temperature = ["calibrate", "-m", model_dir, "-t", "1", "--traces", probe_dir, "--out", tmp_path / "run"]
    assert_usage_error(other_temperature, "--traces")
    assert not (tmp_path / "run" / "study.db").exists()
    paged = ["calibrate", "-m", model_dir, "-t", "0", "--traces", probe_dir, "--out", tmp_path / "run"]
    assert_usage_error([*paged, "--block-size", "16"], "--block-size")  # traces at position level
    assert not (tmp_path / "run").exists()


def one_error_line(result) -> str:
    """The single ``error: ...`` line a runtime error prints (after progress lines, if any)."""
    assert result.exit_code == 1, (result.output, result.exception)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def write_controller(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_missing_file_with_markup_in_its_path_is_named_unchanged(tmp_path):
    missing = tmp_path / "runs[x]" / "[bold]controller.json"
    line = one_error_line(invoke(["show", missing])[0])
    assert str(missing) in line and "not found" in line


def test_markup_in_controller_strings_is_shown_as_text(tmp_path):
    data = copy.deepcopy(valid_examples()[0])
    data["name"] = "[link=https://example.invalid]click[/link]"
    data["calibration"]["note"] = "[red]x[/red] [bold]"
    path = write_controller(tmp_path / "[a]" / "c.json", data)
    result, _ = invoke(["show", path])
    assert result.exit_code == 0, result.output
    assert "[link=https://example.invalid]click[/link]" in result.stdout
    assert "[red]x[/red] [bold]" in result.stdout
    shown, _ = invoke(["show", path, "--json"])
    assert json.loads(shown.stdout)["name"] == data["name"]


def test_huge_integer_in_a_controller_is_a_controller_error(tmp_path):
    text = json.dumps(valid_examples()[0]).replace('"budget": 8192', '"budget": ' + "9" * 5000)
    line = one_error_line(invoke(["show", write_controller(tmp_path / "c.json", text)])[0])
    assert "cache.budget" in line and "5000 digits" in line and len(line) < 300


def test_oversize_controller_is_refused_fast(tmp_path):
    data = copy.deepcopy(valid_examples()[0])
    data["calibration"]["padding"] = ["x" * 1000] * (2 * MAX_CONTROLLER_BYTES // 1000)
    path = write_controller(tmp_path / "big.json", data)
    result, seconds = invoke(["show", path])
    line = one_error_line(result)
    assert "larger than 1048576 bytes" in line and str(path) in line
    assert seconds < 3


def test_long_strings_are_refused_without_echoing_them(tmp_path):
    data = copy.deepcopy(valid_examples()[0])
    data["name"] = "n" * 200_000
    line = one_error_line(invoke(["show", write_controller(tmp_path / "c.json", data)])[0])
    assert line.startswith("error: name: string of 200000 characters") and len(line) < 300


def read_only_dir(tmp_path: Path) -> Path:
    """A directory nobody may write into (as root, chmod does not stop writes: use sysfs)."""
    if os.geteuid() == 0:
        return Path("/sys/rift-ada-test")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


def test_read_only_output_paths_are_one_line(probe_dir, model_dir, tmp_path):
    target = read_only_dir(tmp_path) / "out.json"
    line = one_error_line(invoke(["evaluate", "--traces", probe_dir, "--out", target])[0])
    assert str(target) in line and "--out" in line
    calibrate = ["calibrate", "-m", model_dir, "-t", "0", "--traces", probe_dir, "--out", tmp_path / "run"]
    line = one_error_line(invoke([*calibrate, "--controller", target])[0])
    assert str(target) in line and "--controller" in line
    assert not (tmp_path / "run" / "study.db").exists()  # refused before the study started


def test_storage_errors_are_one_line(probe_dir, model_dir, tmp_path):
    not_a_database = tmp_path / "folder.db"
    not_a_database.mkdir()
    arguments = ["calibrate", "-m", model_dir, "-t", "0", "--traces", probe_dir, "--out", tmp_path / "run",
                 "--controller", tmp_path / "c.json", "--storage", f"sqlite:///{not_a_database}"]  # fmt: skip
    line = one_error_line(invoke(arguments)[0])
    assert "--storage" in line and "unable to open database file" in line and "http" not in line
    assert not (tmp_path / "run" / "report.md").exists()


def test_version():
    result, _ = invoke(["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("rift-ada ")


def test_full_disk_during_a_command_is_one_line_naming_the_file(probe_dir, tmp_path, monkeypatch):
    import errno

    import rift_ada.atomic as atomic

    target = tmp_path / "results.json"

    def disk_full(path, write):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(atomic, "atomic_write", disk_full)
    line = one_error_line(invoke(["evaluate", "--traces", probe_dir, "--out", target])[0])
    assert line == f"error: {target}: disk is full (no space left on device); set by --out"
