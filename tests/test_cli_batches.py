"""`rift-ada targets` / `collect --mode closed` with --batch-size, --free-running and --dtype on a tiny model."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.collectors.collect import closed_results
from rift_ada.collectors.targets.files import read_targets
from rift_ada.collectors.trace_io import read_tables


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir, tmp_path_factory):
    """The tiny local model (tests/conftest.py) and a 3-prompt JSONL dataset beside a copy of it."""
    path = tmp_path_factory.mktemp("tiny-with-prompts")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    prompts = ["Explain the sections in order.", "List three numbers and a word.", "Say something short."]
    dataset = path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(prompts)))
    return path


def _invoke(arguments: list[str]) -> None:
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output


def test_targets_and_free_running_closed_loop_are_batch_invariant(tiny_dir, tmp_path):
    common = ["--model", str(tiny_dir), "--temp", "1", "--dataset", f"jsonl:{tiny_dir / 'prompts.jsonl'}"]
    for batch in ("1", "3"):
        out = str(tmp_path / f"t{batch}.parquet")
        _invoke(["targets", *common, "--max-new-tokens", "14", "--batch-size", batch, "--out", out])
    one, three = (read_targets(tmp_path / f"t{batch}.parquet") for batch in ("1", "3"))
    assert [row["response_token_ids"] for row in one] == [row["response_token_ids"] for row in three]
    assert all(len(row["response_token_ids"]) >= 1 for row in one)

    runs = {}
    for batch in ("1", "4"):
        out = tmp_path / f"closed{batch}"
        _invoke(
            [
                "collect", *common, "--mode", "closed", "--free-running", "--policy", "stat", "--policy", "periodic:8",
                "--budget", "128", "--targets", str(tmp_path / "t1.parquet"), "--max-new-tokens", "14",
                "--batch-size", batch, "--out", str(out),
            ]
        )  # fmt: skip
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["free_running"] is True and manifest["dtype"] == "float32"
        runs[batch] = read_tables(out, kinds=["rounds"])["rounds"].to_pydict()
        totals = closed_results(out)
        for label in ("stat", "periodic:8"):
            expected = {row["request_id"]: len(row["response_token_ids"]) for row in one}
            assert dict(zip(totals[label]["request_id"], totals[label]["committed"], strict=True)) == expected
    key = ("request_id", "policy", "round", "accepted")
    order = sorted(range(len(runs["1"]["round"])), key=lambda i: tuple(runs["1"][k][i] for k in key[:3]))
    order4 = sorted(range(len(runs["4"]["round"])), key=lambda i: tuple(runs["4"][k][i] for k in key[:3]))
    assert [[runs["1"][k][i] for k in key] for i in order] == [[runs["4"][k][i] for k in key] for i in order4]


def test_free_running_needs_closed_mode_and_bad_dtype_is_named(tiny_dir, tmp_path):
    common = ["--model", str(tiny_dir), "--dataset", f"jsonl:{tiny_dir / 'prompts.jsonl'}"]
    arguments = ["collect", *common, "--temp", "1", "--free-running", "--out", str(tmp_path / "p")]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2 and "'--free-running': applies to --mode closed only" in result.output
    result = CliRunner().invoke(app, ["targets", *common, "--dtype", "float8", "--out", str(tmp_path / "t.parquet")])
    assert result.exit_code == 2 and "'--dtype'" in result.output and "float8" in result.output


def test_default_batch_doubles_in_reduced_precision():
    from rift_ada.throughput import TARGETS_BATCH, default_batch

    assert default_batch(TARGETS_BATCH, "float32") == TARGETS_BATCH == 16
    assert default_batch(TARGETS_BATCH, None, "cpu") == 16  # the loader's CPU default is float32
    assert default_batch(TARGETS_BATCH, "bfloat16") == default_batch(TARGETS_BATCH, "float16") == 32
    assert default_batch(TARGETS_BATCH, None, "cuda") == 32  # and bfloat16 elsewhere


@pytest.mark.parametrize(
    ("dtype", "given", "expected"),
    [("float32", None, [16, 32]), ("bfloat16", None, [32, 32]), ("bfloat16", "5", [5, 5])],
)
def test_targets_and_collect_take_their_default_batch(tiny_dir, tmp_path, monkeypatch, dtype, given, expected):
    """`rift-ada targets` doubles its rows in reduced precision; a closed-loop collection (and the targets it
    generates) takes `CLOSED_BATCH` in every dtype."""
    import rift_ada.collectors.pipeline as pipeline

    seen = []

    def ensure_targets(*args, batch_size, **kwargs):
        seen.append(batch_size)
        raise SystemExit(0)  # stop before any generation: only the batch the command chose matters

    monkeypatch.setattr(pipeline, "ensure_targets", ensure_targets)
    common = ["--model", str(tiny_dir), "--dataset", f"jsonl:{tiny_dir / 'prompts.jsonl'}", "--dtype", dtype]
    common += [] if given is None else ["--batch-size", given]
    CliRunner().invoke(app, ["targets", *common, "--out", str(tmp_path / "t.parquet")])
    CliRunner().invoke(app, ["collect", *common, "--mode", "closed", "--policy", "stat", "--out", str(tmp_path / "c")])
    assert seen == expected
