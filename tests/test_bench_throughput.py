"""benchmarks/bench_throughput.py --quick runs every stage at two batch sizes beside its roofline."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_throughput.py"


def test_quick_throughput_benchmark_reports_every_cell_beside_its_floors(tmp_path: Path):
    out = tmp_path / "cells.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--profile", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    cells = {(cell["stage"], cell["batch"]): cell for cell in figures["cells"]}
    assert set(cells) == {(stage, batch) for stage in ("closed", "probe", "targets") for batch in (1, 4)}
    for cell in cells.values():
        assert cell["tok_s"] > 0 and cell["memory_tok_s"] > 0 and cell["compute_tok_s"] > 0
        assert cell["peak_rss_scope"] == "cell" and cell["peak_rss_gib"] >= cell["start_rss_gib"] > 0
    assert cells[("closed", 4)]["tokens"] == 4 * cells[("closed", 1)]["tokens"]  # four requests of 16 tokens
    for batch in (1, 4):  # arms that share a history run as one row: fewer rows per stride than arms
        assert 1 <= cells[("probe", batch)]["arm_rows"] < cells[("probe", batch)]["arms"]
    assert figures["skipped"] == []
    assert figures["bandwidth"] > 1e8 and max(figures["gemm"].values()) > 1e8
    groups = figures["profile"]["groups"]
    assert set(groups) == {"gemm", "attention", "cache ops", "other ops", "python and dispatch"}
    assert groups["gemm"] > 0 and sum(groups.values()) <= figures["profile"]["wall"] * 1.05
    assert "profile of one closed-loop round at batch 4" in done.stdout


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_throughput", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Gemma3-270M's shapes: 15 sliding-window layers (512) and 3 full ones, 1 KV head of 256, a tied 262K lm_head
GEMMA3 = {
    "params": 268e6, "weight_bytes": 268e6 * 4, "layers": 18, "full_layers": 3, "sliding_layers": 15,
    "window": 512, "heads": 4, "kv_heads": 1, "head_dim": 256, "element": 4, "vocab": 262144,
}  # fmt: skip


def test_a_sliding_layer_reads_at_most_its_window_and_a_budget_binds_only_the_full_layers():
    bench = load_bench()
    assert bench.layer_keys(GEMMA3, 128, 2048) == 3 * 128 + 15 * 512
    assert bench.layer_keys(GEMMA3, 300, 300) == 18 * 300
    llama = {**GEMMA3, "full_layers": 18, "sliding_layers": 0, "window": 0}
    assert bench.layer_keys(llama, 128, 2048) == 18 * 128

    def memory_floor(costs: dict, context: float) -> float:
        cell = {"stage": "targets", "batch": 16, "mean_context": context}
        return bench.stage_floor(cell, costs, bandwidth=1e10, gemm=1e11, budget=128)["memory_tok_s"]

    # beyond the window only the 3 full layers' KV grows: the floor falls far less than an all-full model's
    gemma_drop = memory_floor(GEMMA3, 512) / memory_floor(GEMMA3, 4096)
    llama_drop = memory_floor(llama, 512) / memory_floor(llama, 4096)
    assert 1 < gemma_drop < llama_drop


def test_cell_memory_counts_each_stage_s_kv_histories_and_widest_logits():
    bench = load_bench()
    per_history = 2 * 1 * 256 * 4 * (3 * 2064 + 15 * 512)  # ISL 2048 + 16 tokens
    assert bench.cell_memory("targets", 16, GEMMA3, 2048, 16, 5) == 16 * (per_history + 262144 * 4)
    assert bench.cell_memory("closed", 16, GEMMA3, 2048, 16, 5) == 16 * (2 * per_history + 12 * 262144 * 4)
    assert bench.cell_memory("probe", 2, GEMMA3, 2048, 16, 5) == 2 * (6 * per_history + 40 * 262144 * 4)


def test_fresh_worker_runs_every_cell_in_a_new_process(tmp_path: Path):
    out = tmp_path / "cells.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--fresh-worker", "--stages", "targets", "--no-prefill-timing",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert [cell["batch"] for cell in cells] == [1, 4]
    assert all(cell["peak_rss_scope"] == "cell" for cell in cells)
    assert cells[0]["worker_pids"] != cells[1]["worker_pids"]


def test_a_probe_with_sliding_window_layers_streams_the_weights_once_per_request():
    bench = load_bench()
    llama = {**GEMMA3, "full_layers": 18, "sliding_layers": 0, "window": 0}
    cell = {"stage": "probe", "batch": 8, "mean_context": 400, "arms": 4}
    stacked = bench.stage_floor(cell, llama, bandwidth=1e10, gemm=1e11, budget=128)
    alone = bench.stage_floor(cell, GEMMA3, bandwidth=1e10, gemm=1e11, budget=128)
    assert alone["memory_tok_s"] < stacked["memory_tok_s"] / 4  # 8 requests' weight streams, not one


def test_a_probe_difference_says_whether_outcomes_or_only_entropies_moved():
    bench = load_bench()
    old = [[40.0, 100.0], [35.0, 200.0]]
    assert bench.probe_difference([[40.0, 100.0 + 1e-4], [35.0, 200.0]], old) == (
        " (outcome sums differ in 0 of 2 requests, entropy sums by 1.0e-06 rel. at most)"
    )
    assert "differ in 1 of 2" in bench.probe_difference([[40.0, 100.0], [36.0, 200.0]], old)


def test_a_goal_says_what_share_of_the_decode_floor_it_needs_and_what_the_floor_allows():
    bench = load_bench()
    # 2,048 tokens after 10 s of prefills; a goal of 50 tok/s leaves 2048 / 50 - 10 = 30.96 s for decode
    bound = bench.goal_bound(50.0, 2048, 10.0, 100.0)
    assert bound["needed_decode_tok_s"] == pytest.approx(2048 / 30.96)
    assert bound["floor_fraction"] == pytest.approx(2048 / 30.96 / 100)
    assert bound["at_floor_tok_s"] == pytest.approx(2048 / (10 + 20.48))
    assert bench.goal_bound(300.0, 2048, 10.0, 100.0)["needed_decode_tok_s"] == float("inf")  # 6.8 s < 10 s

    rows = [
        {"batch": 8, "tok_s": 40.0, "decode_tok_s": 45.0, "tokens": 1024, "prefill_s": 5.0,
         "memory_tok_s": 900.0, "compute_tok_s": 100.0},
        {"batch": 16, "tok_s": 45.0, "decode_tok_s": 50.0, "tokens": 2048, "prefill_s": 10.0,
         "memory_tok_s": 400.0, "compute_tok_s": 100.0},
    ]  # fmt: skip
    line = bench.goal_line("closed", rows, old_tok_s=12.5, old_batch=8)  # the goal: 4 x 12.5 = 50 tok/s
    assert line.startswith("  closed goal 4x old at 8 = 50.0 tok/s: at batch 16 needs decode at 66% of the compute")
    assert "(now 50%, 3.60x)" in line and f"at most {2048 / 30.48 / 12.5:.2f}x" in line
    assert "prefills alone exceed it" in bench.goal_line("targets", rows, old_tok_s=100.0, old_batch=8)


def test_paired_ratios_pair_each_repeat_s_new_cell_with_its_old_cell():
    bench = load_bench()

    def cell(code, batch, repeat, seconds):
        return {"stage": "closed", "code": code, "batch": batch, "repeat": repeat, "tokens": 100,
                "cpu_seconds": seconds}  # fmt: skip

    cells = [cell("new", 16, 0, 10.0), cell("old", 8, 0, 40.0), cell("old", 8, 1, 30.0), cell("new", 16, 1, 20.0),
             cell("new", 16, 2, 10.0)]  # repeat 2's old cell died: no pair  # fmt: skip
    ratios = bench.paired_ratios(cells, "closed", 16, 8, "cpu_seconds")
    assert ratios == [4.0, 1.5]  # not the ratio of medians (10/35 -> 3.5x)
    assert bench.repeat_spread(ratios) == " (per repeat 2.75x, 1.50-4.00x over 2)"
    assert bench.repeat_spread(ratios[:1]) == ""


def test_a_closed_loop_that_runs_no_verification_has_the_draft_steps_alone_as_its_floor():
    bench = load_bench()
    llama = {**GEMMA3, "full_layers": 18, "sliding_layers": 0, "window": 0}
    cell = {"stage": "closed", "batch": 16, "mean_context": 512, "tokens": 1000, "rounds": 200}  # AL 5
    verifying = bench.stage_floor(cell, llama, bandwidth=1e10, gemm=1e11, budget=128)
    forced = bench.stage_floor({**cell, "verifies": False}, llama, bandwidth=1e10, gemm=1e11, budget=128)
    step_flops = 2 * llama["params"] * 16 + 4 * llama["heads"] * llama["head_dim"] * (18 * 128) * 16
    assert forced["compute_tok_s"] == pytest.approx(16 * 5 / (bench.DRAFT_LENGTH * step_flops / 1e11))
    assert forced["compute_tok_s"] > verifying["compute_tok_s"]  # less work per committed token


@pytest.mark.usefixtures("one_torch_thread")
def test_a_closed_cell_runs_every_run_it_asks_for():
    """``--closed-requests N`` runs N runs over the slots, and ``--runs-per-prompt R`` each request R times in a row,
    prefilled once per request by a tree that shares prefills (a bug once cut both to the batch's b runs)."""
    import argparse

    import torch

    bench = load_bench()
    setup = argparse.Namespace(quick=True, preset="smollm2-135m", dtype="float32", isl=64, seed=0)
    model, _ = bench.load(setup)
    prompts = bench.make_prompts(setup, None, 2)
    responses = [torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(2)]
    job = {"stage": "closed", "batch": 2, "budget": 16, "tokens": 16}
    continuous = bench.run_cell(model, {**job, "requests": 5}, prompts, responses)
    assert (continuous["runs"], continuous["tokens"], continuous["prefills"]) == (5, 5 * 16, 5)
    repeated = bench.run_cell(model, {**job, "runs_per_prompt": 3}, prompts, responses)
    assert (repeated["runs"], repeated["tokens"], repeated["prefills"]) == (6, 6 * 16, 2)


def test_a_probe_floor_counts_the_rows_the_tree_ran():
    """A tree that runs arms sharing a history as one row (`arm_rows` per stride) has less work to do: its compute
    floor per token is higher than for every arm's row, and equals the floor of a cell with that many arms."""
    bench = load_bench()
    llama = {**GEMMA3, "full_layers": 18, "sliding_layers": 0, "window": 0}
    every_arm = {"stage": "probe", "batch": 8, "mean_context": 400, "arms": 4}
    shared = bench.stage_floor({**every_arm, "arm_rows": 2.5}, llama, bandwidth=1e10, gemm=1e11, budget=128)
    assert shared["compute_tok_s"] > bench.stage_floor(every_arm, llama, 1e10, 1e11, 128)["compute_tok_s"]
    assert shared == bench.stage_floor({**every_arm, "arms": 2.5}, llama, 1e10, 1e11, 128)
