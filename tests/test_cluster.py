"""Cluster collection: --shard auto from launcher environments, separate shard processes, Ray, status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.collectors.cluster import ShardEnvError, resolve_shard, shard_from_env
from rift_ada.collectors.ray_launcher import plan_shards
from rift_ada.collectors.trace_io import TraceError, parse_shard, read_tables, trace_status

TESTS_DIR = Path(__file__).resolve().parent
LAUNCHER_VARS = (
    "RIFT_ADA_SHARD", "RIFT_ADA_NUM_SHARDS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
    "JOB_COMPLETION_INDEX", "RANK", "WORLD_SIZE",
)  # fmt: skip


def test_shard_auto_reads_each_launcher():
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"})[0] == "3/4"
    slurm_offset = {"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "2"}
    assert shard_from_env(slurm_offset)[0] == "1/2"  # --array=10-11
    assert shard_from_env({"JOB_COMPLETION_INDEX": "2", "RIFT_ADA_NUM_SHARDS": "5"})[0] == "2/5"
    assert shard_from_env({"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})[0] == "1/8"
    assert shard_from_env({"RIFT_ADA_SHARD": "0/3", "RANK": "1", "WORLD_SIZE": "8"})[0] == "0/3"  # explicit wins
    assert resolve_shard("2/7", {}) == "2/7" and resolve_shard(None, {}) is None
    with pytest.raises(ShardEnvError, match="RIFT_ADA_NUM_SHARDS is not"):
        shard_from_env({"JOB_COMPLETION_INDEX": "2"})
    with pytest.raises(ShardEnvError, match="no launcher environment found"):
        shard_from_env({"PATH": "/bin"})
    with pytest.raises(ShardEnvError, match="RANK='x' is not an integer"):
        shard_from_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_shard_auto_in_parse_shard_checks_the_range(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    assert parse_shard("auto") == (1, 2)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    with pytest.raises(TraceError, match="0 <= i < N"):
        parse_shard("auto")


def test_bad_shard_fails_before_any_model_loads(monkeypatch, tmp_path: Path):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    loads = []
    monkeypatch.setattr("rift_ada.collectors.pipeline.load_pair", lambda *a, **k: loads.append(a))
    runner = CliRunner()
    for command in (["collect", "--shard", "auto"], ["collect", "--shard", "2/2"], ["targets", "--shard", "auto"]):
        result = runner.invoke(app, [*command, "--out", str(tmp_path / "x")])
        assert result.exit_code != 0 and ("no launcher environment" in result.output or "0 <= i < N" in result.output)
    assert loads == []


JOB = """
import sys

import torch

sys.path.insert(0, {tests_dir!r})
from tiny_models import VOCAB, tiny_model  # noqa: E402

from rift_ada.collectors.collect import CollectSettings, collect_probe  # noqa: E402
from rift_ada.collectors.datasets import Request  # noqa: E402

SETTINGS = CollectSettings(draft="tiny", target="tiny", temperature=1.0, seed=5, budget=24, obs_window=8,
                           arm_ages=(0, 16))


def main(out_dir, shard=None):
    torch.set_num_threads(1)
    model = tiny_model("llama", seed=5)
    requests, targets = [], []
    for index in range(5):
        generator = torch.Generator().manual_seed(70 + index)
        prompt = torch.randint(0, VOCAB, (40 + 4 * index,), generator=generator).tolist()
        response = torch.randint(0, VOCAB, (30 - 3 * index,), generator=generator).tolist()
        request = Request(f"job-{{index}}", "synthetic", "cat", "high", [{{"role": "user", "content": "x"}}])
        requests.append(request)
        targets.append({{"request_id": request.request_id, "prompt_token_ids": prompt, "response_token_ids": response}})
    return collect_probe(model, requests, targets, out_dir, SETTINGS, shard=shard,
                         extra_manifest={{"request_ids": sorted(r.request_id for r in requests)}})


if __name__ == "__main__":  # argv: collect OUT --shard auto  (what the Ray launcher passes)
    assert sys.argv[1] == "collect" and sys.argv[3:] == ["--shard", "auto"], sys.argv
    summary = main(sys.argv[2], "auto")
    print(summary.collected, summary.skipped)
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    script = tmp_path_factory.mktemp("job") / "collect_job.py"
    script.write_text(JOB.format(tests_dir=str(TESTS_DIR)))
    return script


def _clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in LAUNCHER_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def _assert_same_trace_set(a: Path, b: Path) -> None:
    tables_a, tables_b = read_tables(a), read_tables(b)
    assert sorted(tables_a) == sorted(tables_b) == ["positions", "requests", "strides"]
    for kind in tables_a:
        assert tables_a[kind].num_rows == tables_b[kind].num_rows > 0
        for name in tables_a[kind].column_names:
            left = np.asarray(tables_a[kind][name].to_pylist(), dtype=object)
            right = np.asarray(tables_b[kind][name].to_pylist(), dtype=object)
            np.testing.assert_array_equal(left, right, err_msg=f"{kind}.{name}")


@pytest.fixture(scope="module")
def single(job: Path, tmp_path_factory) -> Path:
    """The unsharded reference run, in this process."""
    import runpy

    import torch

    out = tmp_path_factory.mktemp("single") / "t"
    threads = torch.get_num_threads()
    try:
        summary = runpy.run_path(str(job), run_name="collect_job")["main"](out)
    finally:
        torch.set_num_threads(threads)
    assert summary.collected == 5
    return out


def test_two_shard_processes_via_shard_auto_equal_one_unsharded_run(job: Path, single: Path, tmp_path: Path):
    sharded = tmp_path / "sharded"
    launchers = [
        _clean_env(SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2"),
        _clean_env(JOB_COMPLETION_INDEX="1", RIFT_ADA_NUM_SHARDS="2"),
    ]
    processes = [
        subprocess.Popen([sys.executable, str(job), "collect", str(sharded), "--shard", "auto"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for env in launchers
    ]  # fmt: skip
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-2000:]
    assert sorted(stdout.split()[0] for stdout, _ in outputs) == ["2", "3"]  # 5 requests dealt 3 + 2
    status = trace_status(sharded)
    assert [(row["shard"], row["committed"], row["expected"]) for row in status["shards"]] == [
        ("0/2", 3, 3), ("1/2", 2, 2)
    ]  # fmt: skip
    assert status["missing_request_ids"] == [] and all(row["writer"] is None for row in status["shards"])
    _assert_same_trace_set(sharded, single)


def test_status_command_shows_per_shard_progress(job: Path, tmp_path: Path, monkeypatch):
    import runpy

    import torch

    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")  # torchrun
    monkeypatch.setenv("WORLD_SIZE", "3")
    out = tmp_path / "t"
    threads = torch.get_num_threads()
    try:
        summary = runpy.run_path(str(job), run_name="collect_job")["main"](out, "auto")
    finally:
        torch.set_num_threads(threads)
    assert (summary.n_requests, summary.collected) == (2, 2)
    runner = CliRunner()
    as_json = runner.invoke(app, ["status", str(out), "--json"])
    assert as_json.exit_code == 0, as_json.output
    info = json.loads(as_json.output)
    assert (info["n_requests_committed"], info["n_requests_expected"]) == (2, 5)
    assert [(row["shard"], row["committed"], row["expected"]) for row in info["shards"]] == [("1/3", 2, 2)]
    assert len(info["missing_request_ids"]) == 3
    text = runner.invoke(app, ["status", str(out)])
    assert text.exit_code == 0 and "2 of 5 requests committed" in text.output and "1/3" in text.output
    missing = runner.invoke(app, ["status", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "manifest not found" in missing.output


def test_ray_launcher_plans_one_task_per_shard():
    tasks = plan_shards(["collect", "--model", "m", "--out", "/shared/t"], 3, command=("rift-ada",))
    assert [task.shard for task in tasks] == ["0/3", "1/3", "2/3"]
    assert tasks[1].argv == ("rift-ada", "collect", "--model", "m", "--out", "/shared/t", "--shard", "auto")
    assert tasks[2].env == {"RIFT_ADA_SHARD": "2/3"}
    with pytest.raises(ValueError, match="do not pass --shard"):
        plan_shards(["collect", "--shard", "0/2"], 2)
    with pytest.raises(ValueError, match="must start with one of"):
        plan_shards(["calibrate"], 2)


def test_ray_launcher_on_a_local_ray_instance(job: Path, single: Path, tmp_path: Path):
    ray = pytest.importorskip("ray")
    from rift_ada.collectors.ray_launcher import launch

    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})  # fmt: skip
    try:
        out = tmp_path / "ray"
        reports = launch(["collect", str(out)], 2, num_gpus=0, num_cpus=1, command=(sys.executable, str(job)))
    finally:
        ray.shutdown()
    assert [report["shard"] for report in reports] == ["0/2", "1/2"]
    _assert_same_trace_set(out, single)


def test_cli_sharded_targets_then_sharded_collect(tiny_model_dir, tmp_path: Path, monkeypatch):
    """targets --shard (resumable, merged by the last shard) then collect --shard auto, through the CLI."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()
    common = ["--model", str(tiny_model_dir), "--dataset", "embedded:small", "--limit", "3", "--max-new-tokens", "6"]
    one_shot, sharded = tmp_path / "one.parquet", tmp_path / "sharded.parquet"
    result = runner.invoke(app, ["targets", *common, "--out", str(one_shot)])
    assert result.exit_code == 0, result.output
    first = runner.invoke(app, ["targets", *common, "--out", str(sharded), "--shard", "1/2"])
    assert first.exit_code == 0 and "other shards are not finished" in first.output and not sharded.exists()
    last = runner.invoke(app, ["targets", *common, "--out", str(sharded)], env={"SLURM_ARRAY_TASK_ID": "0",
                         "SLURM_ARRAY_TASK_COUNT": "2"})  # fmt: skip
    assert last.exit_code == 0, last.output
    from rift_ada.collectors.targets.files import read_targets, targets_sha256

    assert read_targets(sharded) == read_targets(one_shot)

    traces = tmp_path / "probe"
    probe = ["collect", *common, "--targets", str(sharded), "--out", str(traces), "--arm-ages", "0,16"]
    for index in (1, 0):
        env = {"JOB_COMPLETION_INDEX": str(index), "RIFT_ADA_NUM_SHARDS": "2"}
        result = runner.invoke(app, [*probe, "--shard", "auto"], env=env)
        assert result.exit_code == 0, result.output
    info = trace_status(traces)
    assert [(row["shard"], row["committed"]) for row in info["shards"]] == [("0/2", 2), ("1/2", 1)]
    manifest = json.loads((traces / "manifest.json").read_text())
    assert manifest["targets"]["sha256"] == targets_sha256(sharded) and manifest["targets"]["max_new_tokens"] == 6
    # Another token cap is refused before anything is written; the targets file is unchanged.
    before = targets_sha256(sharded)
    other = [arg if arg != "6" else "8" for arg in probe]
    refused = runner.invoke(app, [*other, "--shard", "0/2"])
    assert refused.exit_code != 0 and "max_new_tokens: file 6 != run 8" in " ".join(refused.output.split())
    assert targets_sha256(sharded) == before
