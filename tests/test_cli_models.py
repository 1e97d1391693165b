"""Big-model loading through the CLI: a device map passed to from_pretrained and recorded; tokenizer-only imports."""

from __future__ import annotations

import json

import pytest
import transformers
from typer.testing import CliRunner

import rift_ada.collectors.pipeline as pipeline
import rift_ada.models as models
from rift_ada.cli.app import app
from rift_ada.collectors.targets.files import read_targets
from rift_ada.models import load_model


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    """The tiny local model directory (tests/conftest.py)."""
    return tiny_model_dir


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"id": "r1", "prompt": "List three prime numbers and explain why each one is prime, step by step."}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_load_model_passes_the_device_map(tiny_dir, monkeypatch):
    calls = []
    from_pretrained = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs.get("device_map"))
        return from_pretrained(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    placed, _ = load_model(str(tiny_dir), device="meta", device_map="cpu")
    moved, _ = load_model(str(tiny_dir), device="meta")
    assert calls == ["cpu", None]
    # With a device map transformers places the weights and `device` is not applied after.
    assert next(placed.parameters()).device.type == "cpu"
    assert next(moved.parameters()).device.type == "meta"


def test_collect_records_the_device_map_in_the_manifest(tiny_dir, prompts, tmp_path):
    out = tmp_path / "traces"
    arguments = ["collect", "--model", tiny_dir, "--dataset", f"jsonl:{prompts}", "--out", out, "--budget", "64",
                 "--arm-ages", "0,8", "--max-new-tokens", "12", "--device-map", "cpu"]  # fmt: skip
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["device_map"] == "cpu"
    assert "[collect probe] 1/1 requests (100%)" in result.stderr  # progress lines in a log


def test_targets_import_loads_only_the_tokenizer(tiny_dir, prompts, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for an import")

    monkeypatch.setattr(models, "load_model", no_model)
    monkeypatch.setattr(pipeline, "load_model", no_model)
    monkeypatch.setattr(pipeline, "load_pair", no_model)
    responses = tmp_path / "responses.jsonl"
    responses.write_text(json.dumps({"id": "r1", "response": "2, 3 and 5: each has no divisor but 1 and itself."}))
    out = tmp_path / "targets.parquet"
    arguments = ["targets", "--model", tiny_dir, "--dataset", f"jsonl:{prompts}", "--import", responses, "--out", out]
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code == 0, result.output
    rows = read_targets(out)
    assert [row["request_id"] for row in rows] == ["r1"] and len(rows[0]["response_token_ids"]) > 5
