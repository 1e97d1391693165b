"""Where the limit is: closed loop, probe and target generation tokens/s against batch size, beside the roofline.

    .venv/bin/python benchmarks/bench_throughput.py                      # SmolLM2-135M, batches 1 4 8 16 32
    .venv/bin/python benchmarks/bench_throughput.py --batches 1,16,64 --preset gemma3-270m   # any batches, preset
    .venv/bin/python benchmarks/bench_throughput.py --quick              # tiny random llama, < 60 s (a test runs it)
    .venv/bin/python benchmarks/bench_throughput.py --against /tmp/old   # + the same cells on other code, interleaved
    .venv/bin/python benchmarks/bench_throughput.py --profile 16         # + a profile of one closed-loop round, B = 16

Every cell (stage, batch b) runs b ragged requests (prompt lengths ISL - 8 i, i < 16) through the
library function a collection calls, in a worker process that loaded the model once:

- ``targets``: `generate_responses` of b prompts (greedy, EOS suppressed), tokens = output tokens;
- ``closed``: `speculative_generate_batch(max_batch=b)` of b teacher-forced runs (rift-stat budget B,
  periodic refresh every 32 tokens, K = 11, T = 0, KV self-speculation), tokens = committed tokens;
  ``--closed-requests N`` runs N of them instead (request i the i mod b-th's prompt and response), so
  that finished runs hand their slot on (continuous batching) as in an evidence run's closed loop, where
  the batch stays full until the last b runs; ``--runs-per-prompt R`` runs each of the b requests R times in a
  row, as a collection runs its policies of one request (refresh every 32, 16, 64, 128 tokens in turn), so a
  tree that prefills each prompt once for its adjacent runs (since `_SharedPrefills`) pays b prefills, not b R;
- ``probe``: `probe_requests(batch_size=b)` of b requests (default arms, stride 8), tokens = positions.

The forced responses are generated once (the first worker, greedy) and shared by every worker.
tok/s is end to end (each request's prefill included); ``decode`` leaves out the prefills, timed in
the same worker. Rates are per CPU second of the worker (``--wall``: per wall second): on a shared
machine a single-threaded job's CPU time barely depends on the other jobs, its wall time does.
With ``--against DIR`` a second worker imports rift_ada from DIR (a package tree
made by ``--make-tree``) and every cell runs on both, alternately, so the ratio new/old of one cell
is measured side by side.

Roofline of a cell, measured in the same run with torch: the memory bandwidth of a large copy and the best GEMM
rate over (M, hidden) x (hidden, intermediate) products. A forward of n tokens over contexts c streams the weights
of every Linear (the lm_head included, a tied embedding once: Gemma3's 262K-row lm_head is its embedding) plus the
KV it reads, and costs 2 n P + 4 n H d k FLOPs, k the keys read summed over the layers: a full-attention layer
reads c (or the budget), a sliding-window layer (Gemma3: 15 of 18, window 512) at most its window, budgeted or not;
its floor is max(bytes / bandwidth, FLOPs / GEMM rate). A stage's floor per committed token adds its forwards:
closed loop per round K single-token draft steps over the budget (of every row, or, for a tree whose teacher-forced
rows stop drafting at their first rejected draft, of the row-steps they drafted) and, for a tree before 4022f1c,
one verification of K + 1 tokens over the full context (since 4022f1c a teacher-forced batch runs none: its rows
read the target's pass over the response, made at their start, so its floor is the draft steps'; no re-feed of the
accepted tokens: since 19d9d78 the rollback keeps the draft steps' KV; the floors printed before it counted one
forward of AL tokens over the budget too); probe per stride one forward of every arm's 8 tokens over the budget
(since 49ee970 of the rows the tree ran: arms that share a history share one) plus the canonical pass over the full
context (stacked over the b requests, but one request at a time for a model with sliding-window layers, as
`probe_requests` runs them); targets one forward of b tokens over the full context.
``%mem`` and ``%gemm`` are the measured decode rate over each floor's rate; the larger names the bound that stops
the stage. Both machine figures are the best of many tries, before and after the cells (other jobs on a shared
machine only slow some tries).

With ``--against`` the baseline and ``--goals``, each stage also prints its goal line: issue 28's goal (`GOALS`:
closed loop 4x, probe 2x, targets 3x the old code's end-to-end rate at its batch) as a rate, the share of the
binding decode floor that the new code's fastest batch would need to reach it with the prefill seconds it
measured, the share it reaches now, and the most that floor allows with those prefills (`goal_bound`). A goal that
needs more than 100 % is out of reach of decode work at that batch and dtype; "prefills alone exceed it" means the
prompts' forwards take longer than the goal allows for the whole stage.

Memory: ``peak GiB`` is the cell's own peak RSS (the worker resets its VmHWM through
/proc/self/clear_refs before each cell; where it cannot, the JSON's ``peak_rss_scope`` says "worker so
far"), so it includes the loaded model and what earlier cells left live in the worker, shown as
``start GiB`` (the worker gives freed heap back to the system before each cell,
``release_free_heap``); ``--fresh-worker`` runs every cell in a new worker (one model load each), so
``start GiB`` is the loaded model alone. A cell whose estimated KV histories and logits (`cell_memory`) exceed
90 % of MemAvailable is skipped, and a worker the kernel kills mid-cell (it sets its oom_score_adj to
1000, so it goes before the machine's other jobs) is reported and replaced; both are listed as "not
measured" with the reason, and the run goes on. Torch runs on 1 thread by default.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

STAGES = ("closed", "probe", "targets")
DRAFT_LENGTH = 11
RUN_INTERVALS = (32, 16, 64, 128)  # --runs-per-prompt: the refresh interval of a request's k-th run, in turn
GOALS = {"closed": 4.0, "probe": 2.0, "targets": 3.0}  # issue 28: new tok/s over the old default's, end to end


def probe_difference(new: list[list[float]], old: list[list[float]]) -> str:
    """Which of the probe's per-request sums differ: acceptance outcomes (a changed arm's result) or only the
    entropies (a kernel's last bits), and by how much."""
    outcomes = sum(a[0] != b[0] for a, b in zip(new, old, strict=True))
    entropy = max(abs(a[1] - b[1]) / max(abs(b[1]), 1e-12) for a, b in zip(new, old, strict=True))
    return f" (outcome sums differ in {outcomes} of {len(old)} requests, entropy sums by {entropy:.1e} rel. at most)"


# ---- the machine: bandwidth and GEMM rate ------------------------------------------------------------
def measure_bandwidth(megabytes: int = 256, repeats: int = 12) -> float:
    """Bytes/s of a large tensor copy (read + write)."""
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * 4 / best


def measure_gemm(hidden: int, intermediate: int, dtype: torch.dtype, rows: tuple[int, ...] = (64, 256, 1024, 2048)):
    """{M: FLOP/s} of (M, hidden) @ (hidden, intermediate), best of a few."""
    rates = {}
    weight = torch.randn(hidden, intermediate, dtype=dtype)
    for m in rows:
        x = torch.randn(m, hidden, dtype=dtype)
        torch.mm(x, weight)
        best = float("inf")
        for _ in range(max(5, 20480 // m)):  # best of many: a shared machine's other jobs only slow some
            start = time.perf_counter()
            torch.mm(x, weight)
            best = min(best, time.perf_counter() - start)
        rates[m] = 2 * m * hidden * intermediate / best
    return rates


# ---- the model's cost per forward ------------------------------------------------------------------
def model_costs(model: Any) -> dict[str, float]:
    """Linear weight bytes and parameters (tied weights once: Gemma3's lm_head is its embedding), heads, head
    dim, KV heads, element size, vocabulary, and the attention layers: ``full_layers`` read every stored key,
    ``sliding_layers`` at most ``window`` of them (``config.layer_types``; other layer kinds read no KV)."""
    seen, params, weight_bytes = set(), 0, 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.data_ptr() not in seen:
            seen.add(module.weight.data_ptr())
            params += module.weight.numel()
            weight_bytes += module.weight.numel() * module.weight.element_size()
    config = model.config
    heads = config.num_attention_heads
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return {
        "params": params,
        "weight_bytes": weight_bytes,
        "layers": config.num_hidden_layers,
        "full_layers": sum(kind == "full_attention" for kind in kinds),
        "sliding_layers": sum(kind == "sliding_attention" for kind in kinds),
        "window": getattr(config, "sliding_window", None) or 0,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", heads),
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "element": next(model.parameters()).element_size(),
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "vocab": config.vocab_size,
    }


def layer_keys(costs: dict[str, float], keys: float, context: float) -> float:
    """Keys read per row summed over the attention layers: a full layer reads ``keys`` (its budget or the whole
    context), a sliding layer at most its window of the context (a budget never applies to it)."""
    return costs["full_layers"] * keys + costs["sliding_layers"] * min(costs["window"], context)


def stage_floor(cell: dict[str, Any], costs: dict[str, float], bandwidth: float, gemm: float, budget: int) -> dict:
    """Seconds per committed token under the memory and the compute floor, from the cell's own shape."""
    batch, context = cell["batch"], cell["mean_context"]
    heads, kv_heads, head_dim = costs["heads"], costs["kv_heads"], costs["head_dim"]
    kv_bytes_per_key = 2 * kv_heads * head_dim * costs["element"]  # one layer's

    def forward(tokens: float, rows: float, keys_per_row: float) -> tuple[float, float]:
        """(bytes, FLOPs) of one forward: ``rows`` rows, ``tokens`` tokens in all, each row reads its keys once."""
        keys = layer_keys(costs, keys_per_row, context)
        flops = 2 * costs["params"] * tokens + 4 * heads * head_dim * keys * tokens
        return costs["weight_bytes"] + kv_bytes_per_key * keys * rows, flops

    working = min(budget, context)
    if cell["stage"] == "targets":
        parts, committed = [forward(batch, batch, context)], batch
    elif cell["stage"] == "closed":
        al = cell["tokens"] / max(1, cell["rounds"])  # committed tokens per row-round
        # rows a draft step feeds: every row every step, or (a tree whose forced rows stop at their first rejected
        # draft) the steps they drafted, spread over the K steps (FLOPs follow the row-steps, bytes the K forwards)
        fed = cell.get("draft_row_steps", DRAFT_LENGTH * cell["rounds"]) / max(1, cell["rounds"]) / DRAFT_LENGTH
        parts = [forward(batch * fed, batch * fed, working)] * DRAFT_LENGTH
        if cell.get("verifies", True):
            parts.append(forward(batch * (DRAFT_LENGTH + 1), batch, context))
        committed = batch * al
    elif costs["sliding_layers"]:  # probe, sliding-window layers: each request's forwards alone (not stacked)
        stride, arms = 8, cell.get("arm_rows", cell["arms"])
        parts = [forward(arms * stride, arms, working), forward(stride, 1, context)] * batch
        committed = batch * stride
    else:  # probe: per stride, every arm's stride tokens over its working set, the canonical pass over all
        stride, arms = 8, cell.get("arm_rows", cell["arms"])
        parts = [forward(batch * arms * stride, batch * arms, working), forward(batch * stride, batch, context)]
        committed = batch * stride
    memory = sum(p[0] for p in parts) / bandwidth
    compute = sum(p[1] for p in parts) / gemm
    return {"memory_tok_s": committed / memory, "compute_tok_s": committed / compute}


def goal_bound(goal_tok_s: float, tokens: float, prefill_s: float, floor_tok_s: float) -> dict[str, float]:
    """What a goal rate (end to end, prefills included) asks of a cell's decode: the decode rate it needs given
    the cell's measured prefill seconds (inf where the prefills alone take longer than the goal allows), that
    rate as a fraction of the decode floor's rate, and the end-to-end rate at the floor with those prefills."""
    decode_budget_s = tokens / goal_tok_s - prefill_s
    needed = tokens / decode_budget_s if decode_budget_s > 0 else float("inf")
    return {
        "needed_decode_tok_s": needed,
        "floor_fraction": needed / floor_tok_s,
        "at_floor_tok_s": tokens / (prefill_s + tokens / floor_tok_s),
    }


def goal_line(stage: str, rows: list[dict[str, Any]], old_tok_s: float, old_batch: int) -> str:
    """One line per stage: its goal (`GOALS`) against the old code's rate, at the new code's fastest batch: the
    share of the binding decode floor it needs, the share measured now, and the most the floor allows."""
    best = max(rows, key=lambda row: row["tok_s"])
    floor = min(best["memory_tok_s"], best["compute_tok_s"])
    bound = "compute" if best["compute_tok_s"] <= best["memory_tok_s"] else "memory"
    goal = GOALS[stage]
    need = goal_bound(goal * old_tok_s, best["tokens"], best["prefill_s"], floor)
    needs = (
        "prefills alone exceed it"
        if need["needed_decode_tok_s"] == float("inf")
        else f"needs decode at {100 * need['floor_fraction']:.0f}% of the {bound} floor"
    )
    return (
        f"  {stage} goal {goal:.0f}x old at {old_batch} = {goal * old_tok_s:.1f} tok/s: at batch {best['batch']} "
        f"{needs} (now {100 * best['decode_tok_s'] / floor:.0f}%, {best['tok_s'] / old_tok_s:.2f}x); "
        f"at that floor with these prefills at most {need['at_floor_tok_s'] / old_tok_s:.2f}x"
    )


def paired_ratios(cells: list[dict[str, Any]], stage: str, new_batch: int, old_batch: int, clock: str) -> list[float]:
    """The new code's rate at ``new_batch`` over the old code's at ``old_batch``, one ratio per repeat that ran both
    (the two cells of a repeat run back to back, so each ratio shares that stretch's load)."""

    def rates(code: str, batch: int) -> dict[int, float]:
        return {
            cell["repeat"]: cell["tokens"] / cell[clock]
            for cell in cells
            if cell["stage"] == stage and cell["batch"] == batch and cell["code"] == code
        }

    new, old = rates("new", new_batch), rates("old", old_batch)
    return [new[repeat] / old[repeat] for repeat in sorted(new.keys() & old.keys())]


def repeat_spread(ratios: list[float]) -> str:
    """`` (median, lowest-highest of N repeats)`` for two or more paired ratios; nothing for fewer."""
    if len(ratios) < 2:
        return ""
    return f" (per repeat {statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)})"


def cell_memory(stage: str, batch: int, costs: dict[str, float], isl: int, tokens: int, arms: int) -> float:
    """Bytes a cell holds beyond the loaded model (an estimate): the KV histories of its ``batch`` requests (closed
    loop: draft + target cache, an upper bound since 4022f1c keeps no target cache for forced rows; probe: the
    canonical cache + one per compressed arm; targets: one), each of ISL + tokens positions (a sliding layer stores
    at most its window), and the logits of its widest forward."""
    length = isl + tokens
    per_history = 2 * costs["kv_heads"] * costs["head_dim"] * costs["element"] * layer_keys(costs, length, length)
    histories = {"closed": 2, "probe": arms + 1, "targets": 1}[stage]
    rows = {"closed": DRAFT_LENGTH + 1, "probe": arms * 8, "targets": 1}[stage]
    return batch * (histories * per_history + rows * costs["vocab"] * 4)


def probe_arms_for(tokens: int) -> int:
    """Compressed arms a probe of ``tokens`` response tokens runs (ages that refresh within it, plus ``stat``)."""
    from rift_ada.collectors.probe_traces import DEFAULT_ARM_AGES

    return 1 + sum(1 for age in DEFAULT_ARM_AGES if age // 8 < -(-tokens // 8) - 1)


def available_bytes() -> float:
    """The kernel's MemAvailable (inf where /proc/meminfo is not there)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def release_heap() -> bool:
    """``rift_ada.memory.release_free_heap`` (glibc's malloc_trim) where the tree under test has it."""
    try:
        from rift_ada.memory import release_free_heap
    except ImportError:  # a tree from before 2026-12-02 keeps its freed heap (outside the timed part either way)
        return False
    return release_free_heap()


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_gib(field: str) -> float:
    """``VmHWM`` (peak since the last reset) or ``VmRSS`` (now) of this process, GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1]) / 2**20
    raise KeyError(field)


# ---- requests --------------------------------------------------------------------------------------
def make_prompts(args: argparse.Namespace, tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` ragged prompts: request i keeps ISL - 8 (i mod 16) tokens (ISL >= 128)."""
    if tokenizer is None:
        generator = torch.Generator().manual_seed(args.seed)
        base = [torch.randint(0, 96, (args.isl,), generator=generator).tolist() for _ in range(4)]
    else:
        from rift_ada.collectors.datasets import encode_prompt, load_dataset

        encoded = [encode_prompt(tokenizer, r.prompt_messages) for r in load_dataset("embedded:small", tokenizer)]
        base = [ids for ids in encoded if len(ids) >= args.isl] or encoded
        base = [(ids * (args.isl // len(ids) + 1))[-args.isl :] for ids in base]
    step = 8 if args.isl >= 128 else max(1, args.isl // 20)  # --quick's short prompts stay non-empty
    return [base[i % len(base)][step * (i % 16) :] for i in range(count)]


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.quick:
        import transformers

        config = transformers.LlamaConfig(
            vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        )  # fmt: skip
        torch.manual_seed(args.seed)
        return transformers.LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval(), None
    from rift_ada.models import PRESETS, load_model

    return load_model(PRESETS[args.preset].draft, device="cpu", dtype=args.dtype)


def closed_cell_inputs(dtype: str, batch: int, tokens: int, preset: str = "smollm2-135m") -> tuple[Any, ...]:
    """(model, prompts, job, responses) of a closed-loop cell as this bench makes it (ragged ISL 328-448 prompts,
    their greedy responses of ``tokens`` tokens, budget 128), for the investigations that time inside one."""
    setup = argparse.Namespace(quick=False, preset=preset, dtype=dtype, isl=448, seed=0)
    model, tokenizer = load(setup)
    prompts = make_prompts(setup, tokenizer, batch)
    job = {"batch": batch, "budget": 128, "tokens": tokens}
    responses = run_cell(model, {**job, "stage": "targets", "eos": tokenizer.eos_token_id}, prompts, None)
    return model, prompts, job, responses


# ---- the worker: one model, cells on request -------------------------------------------------------
def run_cell(model: Any, job: dict[str, Any], prompts: list[list[int]], responses: list[list[int]] | None):
    from rift_ada.budget import make_policy

    try:
        from rift_ada.collectors.targets.generate import ResponseRequest, generate_responses
    except ImportError:  # an --against tree from before collectors/targets/ (2026-12-02)
        from rift_ada.collectors.targets import ResponseRequest, generate_responses  # type: ignore[no-redef]

    stage, batch, budget, tokens = job["stage"], job["batch"], job["budget"], job["tokens"]
    chosen = prompts[:batch]
    intervals = [32] * batch
    if stage == "closed" and job.get("requests"):  # continuous batching: more runs than slots
        chosen = [chosen[i % batch] for i in range(job["requests"])]
        responses = [responses[i % batch] for i in range(job["requests"])]
        intervals = [32] * job["requests"]
    if stage == "closed" and job.get("runs_per_prompt", 1) > 1:  # a collection's policies of each request, in a row
        per_prompt = job["runs_per_prompt"]
        chosen = [prompt for prompt in chosen for _ in range(per_prompt)]
        responses = [response for response in responses[:batch] for _ in range(per_prompt)]
        intervals = [RUN_INTERVALS[i % len(RUN_INTERVALS)] for _ in range(batch) for i in range(per_prompt)]
    eos = job.get("eos")
    policy = make_policy("rift-stat", budget=budget, obs_window=min(64, budget))
    out: dict[str, Any] = {"stage": stage, "batch": batch}
    release_heap()  # what earlier cells freed goes back first, so ``start`` is what this worker still holds
    per_cell = reset_peak_rss()  # so VmHWM is this cell's peak, not the worker's so far
    out["start_rss_gib"] = rss_gib("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    if stage == "targets":
        asks = [ResponseRequest(p, tokens, i, tokens) for i, p in enumerate(chosen)]
        result = generate_responses(model, asks, eos_token_id=eos)
        out["tokens"], out["result"] = sum(map(len, result)), result
    elif stage == "closed":
        from rift_ada import speculative
        from rift_ada.speculative import BatchRequest, PeriodicRefresh, speculative_generate_batch

        requests = [
            BatchRequest(p, policy, seed=i, refresh_hook=PeriodicRefresh(every), forced_tokens=r[:tokens])
            for i, (p, r, every) in enumerate(zip(chosen, responses, intervals, strict=False))
        ]
        result = speculative_generate_batch(model, requests, draft_length=DRAFT_LENGTH, max_batch=batch)
        out["tokens"] = sum(len(r.tokens) for r in result)
        out["rounds"] = sum(len(r.rounds) for r in result)
        out["runs"] = len(requests)
        shares = hasattr(speculative, "_SharedPrefills")  # a tree that prefills adjacent runs' prompt once
        texts = [(p, len(r.forced_tokens)) for p, r in zip(chosen, requests, strict=False)]
        out["prefills"] = sum(i == 0 or not shares or text != texts[i - 1] for i, text in enumerate(texts))
        out["verifies"] = not hasattr(speculative, "target_token_probs")  # a tree before 4022f1c verifies forced rows
        if hasattr(speculative, "_forced_accepts"):  # a forced row stops drafting at its first rejection
            out["draft_row_steps"] = sum(len(x.draft_entropies) for r in result for x in r.rounds)
        out["result"] = [[r.tokens, [x.accepted for x in r.rounds], r.refreshes] for r in result]
    else:
        from rift_ada.collectors.probe import probe_requests

        texts = [(p, r[:tokens]) for p, r in zip(chosen, responses, strict=False)]
        bounded = "position_budget" in inspect.signature(probe_requests).parameters  # a tree since this evening
        unbounded = {"position_budget": None} if bounded else {}
        result = dict(probe_requests(model, texts, policy=policy, batch_size=batch, **unbounded))  # the batch asked
        out["tokens"] = sum(len(r) for _, r in texts)
        out["arms"] = probe_arms_for(tokens)
        if hasattr(result[0], "arm_rows_run"):  # a tree that runs arms sharing a history as one row (49ee970)
            strides = sum(-(-len(r) // 8) for _, r in texts)
            out["arm_rows"] = sum(result[i].arm_rows_run for i in range(len(texts))) / strides
        out["result"] = [[float(result[i].outcome.sum()), float(result[i].entropy.sum())] for i in range(len(texts))]
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu
    out["peak_rss_gib"] = rss_gib("VmHWM") if per_cell else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["peak_rss_scope"] = "cell" if per_cell else "worker so far"
    out["worker_pid"] = os.getpid()
    out["mean_context"] = statistics.mean(len(p) for p in chosen) + tokens / 2
    return out


def time_prefills(model: Any, prompts: list[list[int]]) -> list[float]:
    """CPU seconds of one full-KV forward of each prompt but its last token (what every stage pays per request);
    a cell of b requests pays the first b."""
    from transformers import DynamicCache

    seconds = []
    with torch.no_grad():
        for prompt in prompts:
            start = time.process_time()
            model(input_ids=torch.tensor([prompt[:-1]]), cache=DynamicCache(config=model.config), logits_to_keep=1)
            seconds.append(time.process_time() - start)
    return seconds


def profile_round(model: Any, job: dict[str, Any], prompts: list[list[int]], responses: list[list[int]]) -> dict:
    """Self CPU time of one closed-loop round at batch b, grouped: GEMM (packed bf16 Linears included), attention, cache
    ops, other ops, Python."""
    from torch.profiler import ProfilerActivity, profile

    import rift_ada.speculative as speculative
    from rift_ada.budget import make_policy

    batch = job["batch"]
    policy = make_policy("rift-stat", budget=job["budget"], obs_window=min(64, job["budget"]))
    requests = [
        speculative.BatchRequest(p, policy, seed=i, refresh_hook=speculative.PeriodicRefresh(32), forced_tokens=r)
        for i, (p, r) in enumerate(zip(prompts[:batch], responses, strict=False))
    ]
    original = speculative._round
    state: dict[str, Any] = {"round": 0}

    def round_with_profile(*a: Any, **k: Any) -> Any:
        state["round"] += 1
        if state["round"] != 3:  # past the first rounds (rings and masks built)
            return original(*a, **k)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            original(*a, **k)
            state["wall"] = time.perf_counter() - start
        state["prof"] = prof
        raise StopIteration

    speculative._round = round_with_profile
    try:
        speculative.speculative_generate_batch(model, requests, draft_length=DRAFT_LENGTH)
    except StopIteration:
        pass
    finally:
        speculative._round = original
    groups = {"gemm": 0.0, "attention": 0.0, "cache ops": 0.0, "other ops": 0.0}
    gemm = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul", "mkldnn::_linear")
    attention = ("scaled_dot_product", "attention", "aten::_softmax", "aten::softmax", "aten::einsum")
    cache = ("copy", "cat", "index", "gather", "scatter", "slice", "select", "stack", "pad", "roll", "where",
             "masked_fill", "zeros", "empty", "fill", "clone", "expand", "tensor", "arange", "to", "item")  # fmt: skip
    ops = 0.0
    top = []
    for event in state["prof"].key_averages():
        self_s = event.self_cpu_time_total / 1e6
        ops += self_s
        name = event.key
        top.append((self_s, name))
        if any(name.startswith(g) for g in gemm):
            groups["gemm"] += self_s
        elif any(a in name for a in attention):
            groups["attention"] += self_s
        elif any(c in name for c in cache):
            groups["cache ops"] += self_s
        else:
            groups["other ops"] += self_s
    groups["python and dispatch"] = max(0.0, state["wall"] - ops)
    return {"wall": state["wall"], "groups": groups, "top": sorted(top, reverse=True)[:12]}


def worker(args: argparse.Namespace) -> int:
    """Read jobs (JSON lines) on stdin, answer each with a JSON line on stdout.

    The worker asks to be the kernel's first choice when memory runs out (oom_score_adj 1000), so a cell
    too large for a shared machine ends this worker, which the run reports, not another job."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from rift_ada.memory import cap_heap_growth

    cap_heap_growth()
    import rift_ada.collectors.probe  # noqa: F401  (every module now: later edits of the tree don't leak in)

    try:
        import rift_ada.collectors.targets.generate  # noqa: F401
    except ImportError:  # an --against tree from before collectors/targets/
        import rift_ada.collectors.targets  # noqa: F401
    import rift_ada.speculative  # noqa: F401

    model, tokenizer = load(args)
    prompts = make_prompts(args, tokenizer, max(args.batches))
    eos = None if tokenizer is None else tokenizer.eos_token_id
    responses = None
    print(json.dumps({"ready": True, "costs": model_costs(model), "code": __import__("rift_ada").__file__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        job["eos"] = eos
        if job["stage"] == "responses":
            responses = job.get("responses")
            if responses is None:
                cell = run_cell(model, {**job, "stage": "targets"}, prompts, None)
                responses = cell["result"]
            print(json.dumps({"responses": responses}), flush=True)
        elif job["stage"] == "prefill":
            print(json.dumps({"prefill": time_prefills(model, prompts[: job["batch"]])}), flush=True)
        elif job["stage"] == "profile":
            print(json.dumps(profile_round(model, job, prompts, responses)), flush=True)
        else:
            print(json.dumps(run_cell(model, job, prompts, responses)), flush=True)
    return 0


class WorkerDied(RuntimeError):
    """The worker process ended before answering (the kernel's OOM killer sends signal 9)."""


class Worker:
    def __init__(self, argv: list[str], tree: str | None):
        self.argv, self.tree = argv, tree
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        if tree:
            env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            text=True,
        )  # fmt: skip
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            why = " (signal 9: killed, most likely out of memory)" if code == -9 else ""
            raise WorkerDied(f"worker exited with {code}{why}")
        return json.loads(line)

    def ask(self, job: dict[str, Any]) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def fresh(worker: Worker, responses: list[list[int]]) -> Worker:
    """A new worker of the same code in place of ``worker`` (closed, or dead), given the shared responses."""
    if worker.process.poll() is None:
        worker.close()
    replacement = Worker(worker.argv, worker.tree)
    replacement.ask({"stage": "responses", "responses": responses})
    return replacement


def make_tree(commit: str, destination: str) -> None:
    """A package tree of rift_ada at ``commit`` (rift_ada/ with collectors/, policies/, calibrate/, experiments/ and
    cli/ inside; experiments/ only from the commit that split it off calibrate/)."""
    root = Path(__file__).resolve().parent.parent
    target = Path(destination) / "rift_ada"
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        archive = subprocess.run(["git", "-C", str(root), "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", scratch], input=archive, check=True)
        subprocess.run(["cp", "-r", f"{scratch}/rift_ada/.", str(target)], check=True)
        for package in ("collectors", "policies", "calibrate", "experiments", "cli"):
            if not Path(scratch, package).is_dir():
                continue
            subprocess.run(["cp", "-r", f"{scratch}/{package}", str(target / package)], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--quick", action="store_true", help="tiny random llama, batches 1 4, few tokens")
    parser.add_argument("--batches", default="1,4,8,16,32")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--isl", type=int, default=448, help="longest prompt (request i keeps ISL - 8 (i mod 16))")
    parser.add_argument("--tokens", type=int, default=48, help="output tokens per request (closed loop, targets)")
    parser.add_argument("--probe-tokens", type=int, default=64, help="response tokens per probed request")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--against", help="a package tree (see --make-tree) to run every cell on too, alternately")
    parser.add_argument(
        "--random-responses", action="store_true", help="force random responses (no generation: memory runs)"
    )
    parser.add_argument("--wall", action="store_true", help="rates per wall second (default: per CPU second)")
    parser.add_argument(
        "--fresh-worker", action="store_true", help="every cell in a new worker (its peak RSS is the cell's alone)"
    )
    parser.add_argument("--no-prefill-timing", action="store_true", help="decode = tok/s (saves a prefill per request)")
    parser.add_argument("--against-batches", help="batches the --against code runs (default: every one)")
    parser.add_argument(
        "--goals", action="store_true", help="with --against the baseline: each stage's goal line (GOALS, goal_bound)"
    )
    parser.add_argument(
        "--against-dtype", help="the --against code's model dtype (default: --dtype): old code beside new at another"
    )
    parser.add_argument("--make-tree", nargs=2, metavar=("COMMIT", "DIR"), help="write a package tree and exit")
    parser.add_argument("--profile", type=int, default=0, help="profile one closed-loop round at this batch")
    parser.add_argument("--json", help="write every cell's figures here")
    parser.add_argument(
        "--closed-requests", type=int, default=0,
        help="closed-loop runs per cell (default: its batch); more run with continuous batching",
    )  # fmt: skip
    parser.add_argument(
        "--runs-per-prompt", type=int, default=1,
        help="closed loop: each request run this many times in a row (a collection's policies of one request)",
    )  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs_per_prompt < 1 or (args.runs_per_prompt > 1 and args.closed_requests):
        parser.error("--runs-per-prompt: must be >= 1, and 1 with --closed-requests")
    if args.quick:
        args.isl, args.tokens, args.probe_tokens, args.budget = 64, 16, 24, 16
        if args.batches == parser.get_default("batches"):
            args.batches = "1,4"
    args.batches = [int(b) for b in str(args.batches).split(",")] if isinstance(args.batches, str) else args.batches
    if args.make_tree:
        make_tree(*args.make_tree)
        return 0
    if args.worker:
        return worker(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    given, forwarded = list(argv if argv is not None else sys.argv[1:]), []
    while given:  # the worker gets every option but the parent's own
        option = given.pop(0)
        if option in ("--json", "--against"):
            given.pop(0) if given else None
        elif not option.startswith(("--json=", "--against=")):
            forwarded.append(option)
    if args.against_dtype and not args.against:
        parser.error("--against-dtype needs --against")
    dtypes = {"new": args.dtype, "old": args.against_dtype or args.dtype} if args.against else {"new": args.dtype}
    for name in dtypes.values():
        if not isinstance(getattr(torch, name, None), torch.dtype):
            parser.error(f"--dtype / --against-dtype: {name!r} is not a torch dtype (float32, bfloat16, ...)")
    workers = {"new": Worker(forwarded, None)}
    if args.against:  # argparse keeps the last --dtype, so the old worker's overrides the forwarded one
        workers["old"] = Worker(forwarded + ["--dtype", dtypes["old"]], args.against)
    code_costs = {name: w.hello["costs"] for name, w in workers.items()}  # weight and KV bytes follow the dtype
    costs = code_costs["new"]
    load_before = os.getloadavg()[0]
    bandwidth = measure_bandwidth(64 if args.quick else 256)
    hidden, intermediate = int(costs["hidden"]), int(costs["intermediate"])
    rates = {d: measure_gemm(hidden, intermediate, getattr(torch, d)) for d in sorted(set(dtypes.values()))}
    if args.random_responses:
        generator = torch.Generator().manual_seed(args.seed)
        vocab = int(costs["vocab"])
        length = max(args.tokens, args.probe_tokens)
        randoms = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(max(args.batches))]
        for w in workers.values():
            w.ask({"stage": "responses", "responses": randoms})
    else:
        length = max(args.tokens, args.probe_tokens)
        ask = {"stage": "responses", "batch": max(args.batches), "tokens": length, "budget": args.budget}
        randoms = workers["new"].ask(ask)["responses"]
    responses = randoms
    for w in workers.values():
        if w is not workers["new"] and not args.random_responses:
            w.ask({"stage": "responses", "responses": responses})
    stages = args.stages.split(",")
    cells: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for stage in stages:
        for batch in args.batches:
            job = {"stage": stage, "batch": batch, "budget": args.budget,
                   "tokens": args.probe_tokens if stage == "probe" else args.tokens}  # fmt: skip
            if stage == "closed" and args.closed_requests:
                job["requests"] = max(args.closed_requests, batch)
            if stage == "closed" and args.runs_per_prompt > 1:
                job["runs_per_prompt"] = args.runs_per_prompt
            need = cell_memory(stage, batch, costs, args.isl, job["tokens"], probe_arms_for(job["tokens"]))
            free = available_bytes()
            if need > 0.9 * free:  # the kernel would kill the worker (or the machine's other jobs) part way
                reason = f"needs ~{need / 2**30:.1f} GiB of KV and logits, {free / 2**30:.1f} GiB available"
                skipped.append({"stage": stage, "batch": batch, "reason": reason})
                print(f"[cell] {stage} batch {batch}: skipped, {reason}", file=sys.stderr, flush=True)
                continue
            for repeat in range(args.repeats):
                order = list(workers) if repeat % 2 == 0 else list(workers)[::-1]
                for name in order:
                    if name == "old" and args.against_batches and str(batch) not in args.against_batches.split(","):
                        continue
                    if args.fresh_worker:  # nothing an earlier cell (or the responses) left in the heap counts
                        workers[name] = fresh(workers[name], responses)
                    try:
                        cell = workers[name].ask(job)
                    except WorkerDied as died:  # say so, and go on with a fresh worker
                        skipped.append({"stage": stage, "batch": batch, "code": name, "reason": str(died)})
                        print(f"[cell] {stage} batch {batch} {name}: {died}", file=sys.stderr, flush=True)
                        workers[name] = fresh(workers[name], responses)
                        continue
                    cell["code"], cell["repeat"] = name, repeat
                    cells.append(cell)
                    rate, cpu_rate = cell["tokens"] / cell["seconds"], cell["tokens"] / cell["cpu_seconds"]
                    line = f"[cell] {stage} batch {batch} {name}: {rate:.1f} tok/s, {cpu_rate:.1f} tok/CPU-s"
                    print(line, file=sys.stderr, flush=True)
    each = [] if args.no_prefill_timing else workers["new"].ask({"stage": "prefill", "batch": max(args.batches)})
    prefills = {b: sum(each["prefill"][:b]) if each else 0.0 for b in args.batches}
    profile = (
        workers["new"].ask({"stage": "profile", "batch": args.profile, "budget": args.budget}) if args.profile else None
    )
    for w in workers.values():
        w.close()
    load_after = os.getloadavg()[0]
    bandwidth = max(bandwidth, measure_bandwidth(64 if args.quick else 256))  # the machine again, after the cells
    for dtype_name, before in rates.items():
        again = measure_gemm(hidden, intermediate, getattr(torch, dtype_name))
        rates[dtype_name] = {m: max(r, before[m]) for m, r in again.items()}
    gemm = {name: max(rates[dtype_name].values()) for name, dtype_name in dtypes.items()}  # per code

    clock = "seconds" if args.wall else "cpu_seconds"
    low = max(1, args.isl - 120)
    model = f"{'tiny llama' if args.quick else args.preset} " + " / ".join(f"{n} {d}" for n, d in dtypes.items())
    print(
        f"throughput: {model}, ISL {low}-{args.isl} (ragged), "
        f"closed/targets {args.tokens} tokens, probe {args.probe_tokens}, budget {args.budget}, K = {DRAFT_LENGTH}, "
        f"T = 0, {torch.get_num_threads()} thread(s), load {load_before:.1f} / {load_after:.1f}; "
        f"rates per {'wall' if args.wall else 'CPU'} second"
    )
    shape = f"({int(costs['hidden'])} x {int(costs['intermediate'])})"
    gemms = "; ".join(
        f"{dtype_name} " + ", ".join(f"M={m}: {r / 1e9:.1f}" for m, r in by_rows.items())
        for dtype_name, by_rows in rates.items()
    )
    print(f"  machine: copy bandwidth {bandwidth / 1e9:.1f} GB/s; GEMM {shape} {gemms} GFLOP/s")
    print(f"  model: {costs['params'] / 1e6:.1f} M Linear parameters, {costs['weight_bytes'] / 2**20:.0f} MiB weights")
    columns = ("stage", "batch", "code", "tok/s", "decode", "mem floor", "gemm floor", "%mem", "%gemm", "peak GiB",
               "start GiB")  # fmt: skip
    print("  " + " ".join(f"{c:>10}" for c in columns))
    summary = []
    for stage in stages:
        for batch in args.batches:
            for name in workers:
                mine = [c for c in cells if c["stage"] == stage and c["batch"] == batch and c["code"] == name]
                if not mine:
                    continue
                seconds = statistics.median(c[clock] for c in mine)
                tok = mine[0]["tokens"]
                # the b prompts, cycled over the runs, each prefilled as often as the tree did
                prefill_s = prefills[batch] * mine[0].get("prefills", mine[0].get("runs", batch)) / batch
                decode_s = max(1e-9, seconds - prefill_s)
                floor = stage_floor(mine[0], code_costs[name], bandwidth, gemm[name], args.budget)
                rate, decode = tok / seconds, tok / decode_s
                row = {
                    "stage": stage, "batch": batch, "code": name, "tok_s": rate, "decode_tok_s": decode, **floor,
                    "seconds": [c["seconds"] for c in mine], "tokens": tok, "rounds": mine[0].get("rounds"),
                    "peak_rss_gib": max(c["peak_rss_gib"] for c in mine), "start_rss_gib": mine[0]["start_rss_gib"],
                    "peak_rss_scope": mine[0]["peak_rss_scope"], "mean_context": mine[0]["mean_context"],
                    "arms": mine[0].get("arms"), "arm_rows": mine[0].get("arm_rows"),
                    "worker_pids": [c["worker_pid"] for c in mine],
                    "prefill_s": prefill_s,
                }  # fmt: skip
                summary.append(row)
                values = (
                    stage, batch, name, f"{rate:.1f}", f"{decode:.1f}", f"{floor['memory_tok_s']:.1f}",
                    f"{floor['compute_tok_s']:.1f}", f"{100 * decode / floor['memory_tok_s']:.0f}%",
                    f"{100 * decode / floor['compute_tok_s']:.0f}%", f"{row['peak_rss_gib']:.2f}",
                    f"{row['start_rss_gib']:.2f}",
                )  # fmt: skip
                print("  " + " ".join(f"{v:>10}" for v in values))
    for miss in skipped:
        print(f"  {miss['stage']} batch {miss['batch']}: not measured, {miss['reason']}")
    if args.against:
        rate = {(r["stage"], r["batch"], r["code"]): r["tok_s"] for r in summary}
        result = {(c["stage"], c["batch"], c["code"]): c["result"] for c in cells}
        for stage in stages:
            for batch in args.batches:
                if (stage, batch, "old") not in rate:
                    continue
                same = result.get((stage, batch, "new")) == result[(stage, batch, "old")]
                ratios = ", ".join(
                    f"new {b} / old {batch} {rate[(stage, b, 'new')] / rate[(stage, batch, 'old')]:.2f}x"
                    + repeat_spread(paired_ratios(cells, stage, b, batch, clock))
                    for b in args.batches
                    if (stage, b, "new") in rate
                )
                detail = ""
                if stage == "probe" and not same and (stage, batch, "new") in result:
                    detail = probe_difference(result[(stage, batch, "new")], result[(stage, batch, "old")])
                print(f"  {stage}: {ratios}; same results as old at batch {batch}: {same}{detail}")
                if args.goals and not args.no_prefill_timing:
                    new_rows = [r for r in summary if r["stage"] == stage and r["code"] == "new"]
                    if new_rows:
                        print(goal_line(stage, new_rows, rate[(stage, batch, "old")], batch))
    if profile:
        groups = profile["groups"]
        total = profile["wall"]
        print(f"  profile of one closed-loop round at batch {args.profile}: {total * 1e3:.0f} ms")
        for name, seconds in groups.items():
            print(f"    {name:20} {seconds * 1e3:8.1f} ms  {100 * seconds / total:5.1f}%")
        print("    top ops (self CPU): " + "; ".join(f"{n} {s * 1e3:.1f} ms" for s, n in profile["top"][:8]))
    if args.json:
        figures = {"cells": summary, "profile": profile, "bandwidth": bandwidth, "gemm": rates[args.dtype],
                   "gemm_by_dtype": rates, "dtypes": dtypes, "prefill": prefills,
                   "skipped": skipped, "costs": costs, "load": [load_before, load_after]}  # fmt: skip
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
