"""`rift-ada train` end to end on a tiny llama: save, load back, drive `collect`, resume, evaluate."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.models import load_model, resolve_preset
from rift_ada.train.config import TrainConfig
from rift_ada.train.evaluate import EvalSettings, evaluate_runs
from rift_ada.train.trainer import train

pytest.importorskip("peft")

DATA = ["--dataset", "embedded", "--n-requests", "6", "--isl-buckets", "256"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    arguments = ["train", "--model", str(tiny_model_dir), "--out", str(out), *DATA, "--rollout-tokens", "12"]
    arguments += ["--rollout-temp", "0", "--max-length", "400", "--steps", "2", "--batch-size", "1"]
    arguments += ["--lora-rank", "2", "--lr", "1e-2", "--checkpoint-every", "1"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "draft saved to" in result.output
    return out


def test_lora_trained_draft_saves_loads_back_and_drives_collect(trained_run, tiny_model_dir, tmp_path):
    model_dir = trained_run / "model"
    log = [json.loads(line) for line in (trained_run / "train-log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1, 2] and all(record["loss"] > 0 for record in log)
    manifest = json.loads((trained_run / "train.json").read_text())
    assert not set(manifest["split"]["train"]) & set(manifest["split"]["eval"])
    # The saved draft is a plain transformers model (LoRA merged) whose weights moved.
    trained, _ = load_model(str(model_dir))
    base, _ = load_model(str(tiny_model_dir))
    moved = [
        name
        for (name, a), (_, b) in zip(trained.named_parameters(), base.named_parameters(), strict=True)
        if not torch.equal(a, b)
    ]
    assert moved and not any("lora" in name for name, _ in trained.named_parameters())
    # --model DIR knows it drafts for the frozen base model.
    preset = resolve_preset(str(model_dir))
    assert preset.draft == str(model_dir) and preset.target == str(tiny_model_dir.resolve())
    out = tmp_path / "closed"
    arguments = ["collect", "--model", str(model_dir), "--mode", "closed", "--policy", "stat", "--policy", "full"]
    arguments += ["--dataset", "embedded:small", "--limit", "1", "--max-new-tokens", "8", "--budget", "64"]
    result = CliRunner().invoke(app, [*arguments, "--out", str(out)])
    assert result.exit_code == 0, result.output
    collected = json.loads((out / "manifest.json").read_text())
    assert collected["draft"] == str(model_dir) and collected["target"] == str(tiny_model_dir.resolve())
    assert "1 requests collected" in result.output


def test_interrupted_training_resumes_to_the_uninterrupted_result(trained_run, tiny_model_dir, tmp_path):
    config = TrainConfig(
        model=str(tiny_model_dir),
        n_requests=6,
        isl_buckets=(256,),
        rollout_temperature=0.0,
        rollout_max_new_tokens=12,
        max_length=400,
        steps=3,
        batch_size=1,
        lora_rank=2,
        learning_rate=1e-2,
        checkpoint_every=1,
    )
    targets = trained_run / "rollouts.parquet"

    def stop_after_two(step, total, record):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "resumed", targets=targets, on_step=stop_after_two)
    resumed = train(config, tmp_path / "resumed", targets=targets)
    straight = train(config, tmp_path / "straight", targets=targets)
    assert json.loads((tmp_path / "resumed" / "train.json").read_text())["resumed_at"] == 2
    a, _ = load_model(str(resumed.model_dir))
    b, _ = load_model(str(straight.model_dir))
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(x, y, msg=name)
    # Another configuration in the same directory is refused, naming the field.
    with pytest.raises(ValueError, match="rho"):
        train(TrainConfig(**{**config.__dict__, "rho": 0.5}), tmp_path / "resumed", targets=targets)
    # Given rollouts that miss a training request are refused, and the file is left as it was.
    before = targets.read_bytes()
    with pytest.raises(ValueError, match="no rollout for training request"):
        train(TrainConfig(**{**config.__dict__, "seed": 9}), tmp_path / "other", targets=targets)
    assert targets.read_bytes() == before


def test_evaluation_table_compares_with_the_untrained_draft(trained_run, tmp_path):
    settings = EvalSettings(budgets=(96,), dyn_interval=4, max_new_tokens=8, n_resamples=199)
    result = evaluate_runs([trained_run], tmp_path / "eval", settings, labels=["masked"])
    methods = [(row["method"], row["budget"]) for row in result["table"]]
    assert methods == [("Full KV", None), ("RIFT-stat", 96), ("RIFT-dyn (Δ=4)", 96)]
    assert result["n_requests"] == 2
    for row in result["table"]:
        gain = row["gain"]["masked vs untrained"]
        assert gain["estimate"] == pytest.approx(row["al"]["masked"] / row["al"]["untrained"] - 1.0)
        assert 1.0 <= row["al"]["untrained"] <= 12.0
    assert "| RIFT-stat | 96 |" in (tmp_path / "eval" / "eval.md").read_text()
    with pytest.raises(ValueError, match="observation window"):
        EvalSettings(budgets=(32,))


def test_malformed_trained_draft_file_is_named(tmp_path):
    from rift_ada.models import ModelError

    (tmp_path / "rift-ada-draft.json").write_text('{"base_draft": "x"}')
    with pytest.raises(ModelError, match="rift-ada-draft.json"):
        resolve_preset(str(tmp_path))


def test_bad_options_are_refused_before_any_model_loads(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["train", "--model", "no-such-preset", "--mask", "bogus", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "mask must be one of" in result.output
    result = runner.invoke(app, ["train", "--p-values", "0.1,0.5", "--p-probs", "1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "p_values" in result.output
    result = runner.invoke(app, ["train-eval", "--run", str(tmp_path), "--budgets", "32"])
    assert result.exit_code == 2 and "observation window" in result.output
    result = runner.invoke(app, ["train-eval", "--run", str(tmp_path)])  # not a training run: a bad input file
    assert result.exit_code == 1 and "train.json" in result.output
