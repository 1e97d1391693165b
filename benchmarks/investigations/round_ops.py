"""Which operators, at which shapes, take a closed-loop round's time (torch.profiler, one round).

`bench_throughput.py --profile` groups a round's self CPU time in five groups and names the top 8 operators;
this lists the operators by input shape, so that one call site (a verification's masked SDPA, a draft step's
argmax) can be told from another. The profiler stretches small ops (read shares, and time the candidates
without it: `round_shares.py`, `greedy_tokens.py`, `verification_mask.py`). SmolLM2-135M, the bench's ragged
prompts (ISL 328-448) and teacher-forced greedy responses, rift-stat B = 128, K = 11, T = 0, PeriodicRefresh(32),
one thread; the round profiled is the fourth (rings and masks built), the third is timed without the profiler.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/round_ops.py --dtype bfloat16 --batch 32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parents[1]))
import bench_throughput as bench  # noqa: E402

import rift_ada.speculative as speculative  # noqa: E402
from rift_ada.budget import make_policy  # noqa: E402


def profiled_round(dtype: str, batch: int, tokens: int) -> tuple[float, Any]:
    """(seconds of the third round without the profiler, the profiler of the fourth)."""
    args = argparse.Namespace(quick=False, preset="smollm2-135m", dtype=dtype, isl=448, seed=0)
    model, tokenizer = bench.load(args)
    prompts = bench.make_prompts(args, tokenizer, batch)
    job = {"stage": "targets", "batch": batch, "budget": 128, "tokens": tokens, "eos": tokenizer.eos_token_id}
    responses = bench.run_cell(model, job, prompts, None)["result"]
    policy = make_policy("rift-stat", budget=128, obs_window=64)
    requests = [
        speculative.BatchRequest(p, policy, seed=i, refresh_hook=speculative.PeriodicRefresh(32), forced_tokens=r)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    original, state = speculative._round, {"round": 0}

    def round_with_profile(*a: Any, **k: Any) -> Any:
        state["round"] += 1
        start = time.perf_counter()
        if state["round"] == 4:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                original(*a, **k)
            state["prof"] = prof
            raise StopIteration
        out = original(*a, **k)
        state["plain"] = time.perf_counter() - start
        return out

    speculative._round = round_with_profile
    try:
        speculative.speculative_generate_batch(model, requests, draft_length=bench.DRAFT_LENGTH)
    except StopIteration:
        pass
    finally:
        speculative._round = original
    return state["plain"], state["prof"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="response tokens per request (past round 4)")
    parser.add_argument("--rows", type=int, default=30, help="operator-shape rows to print")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, prof = profiled_round(args.dtype, args.batch, args.tokens)
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(event.self_cpu_time_total for event in events) / 1e3
    print(f"{args.dtype}, batch {args.batch}: a round {plain * 1e3:.0f} ms without the profiler; "
          f"{total:.0f} ms of operator self time under it")  # fmt: skip
    print("| self ms | share | calls | operator | input shapes |")
    print("|---:|---:|---:|---|---|")
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.rows]:
        self_ms = event.self_cpu_time_total / 1e3
        print(f"| {self_ms:.1f} | {self_ms / total:.1%} | {event.count} | {event.key} | {event.input_shapes} |")


if __name__ == "__main__":
    main()
