"""Where a closed-loop round's time goes, by forward kind, timed without a profiler.

`torch.profiler` stretches a bf16 round about 3x (per-op overhead), so its shares lean towards the many
small ops. This wraps `rift_ada.speculative.forward_rows` and times each call: the draft's single-token
steps and the target's verification of pending + K tokens; and `_roll_back_draft`, the draft's rollback
(since 19d9d78 a crop, the committed steps' logged queries recorded and one single-token forward for
fully accepted rows; before, and still for H2O rows and recurrent drafts, a re-feed of the kept tokens);
the rest is the round's own Python and bookkeeping.
``--inside`` also times, within each kind, the batched attention, the batched cache layers' updates and
the lm_head.
SmolLM2-135M, ISL 328-448 (the ragged prompts of `bench_throughput.py`), the greedy responses of 32
tokens teacher-forced, rift-stat B = 128, K = 11, T = 0, PeriodicRefresh(32), one thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/round_shares.py --dtype bfloat16 --batch 32
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
import bench_throughput as bench  # noqa: E402

import rift_ada.attention as attention  # noqa: E402
import rift_ada.batch_cache as batch_cache  # noqa: E402
import rift_ada.speculative as speculative  # noqa: E402
from rift_ada.memory import cap_heap_growth  # noqa: E402

KINDS = ("draft step", "verification", "draft rollback")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--inside", action="store_true", help="time attention, cache updates and the lm_head too")
    parser.add_argument("--by-step", action="store_true", help="the draft steps' mean time by step of the round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cap_heap_growth()
    model, prompts, job, responses = bench.closed_cell_inputs(args.dtype, args.batch, args.tokens)

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    inside: dict[tuple[str, str], float] = collections.defaultdict(float)
    current = {"kind": "prefill", "step": 0}
    by_step: dict[int, list[float]] = collections.defaultdict(list)
    forward_rows, round_, roll_back = speculative.forward_rows, speculative._round, speculative._roll_back_draft
    batched_attention, layer_update = attention.batched_attention, batch_cache.BatchedLayer.update
    lm_head_forward = model.lm_head.forward

    def timed(part: str, fn):
        def call(*positional, **named):
            start = time.perf_counter()
            out = fn(*positional, **named)
            inside[(current["kind"], part)] += time.perf_counter() - start
            return out

        return call

    def timed_forward(model, cache, feeds, positions, logits=True):
        if current["kind"] == KINDS[2]:  # a re-feed inside the rollback, which is timed whole
            return forward_rows(model, cache, feeds, positions, logits=logits)
        width = max(map(len, feeds))
        kind = current["kind"] = (
            "prefill" if width > 64 else "draft step" if width == 1 and logits else "verification"
        )
        start = time.perf_counter()
        out = forward_rows(model, cache, feeds, positions, logits=logits)
        elapsed = time.perf_counter() - start
        seconds[kind] += elapsed
        calls[kind] += 1
        if kind == "draft step":
            by_step[current["step"]].append(elapsed)
            current["step"] += 1
        elif kind == "verification":
            current["step"] = 0
        return out

    def timed_rollback(*positional, **named):
        current["kind"] = KINDS[2]
        start = time.perf_counter()
        out = roll_back(*positional, **named)
        seconds[KINDS[2]] += time.perf_counter() - start
        calls[KINDS[2]] += 1
        current["kind"] = "round"
        return out

    def timed_round(*positional, **named):
        start = time.perf_counter()
        out = round_(*positional, **named)
        seconds["round"] += time.perf_counter() - start
        return out

    speculative.forward_rows, speculative._round = timed_forward, timed_round
    speculative._roll_back_draft = timed_rollback
    if args.inside:
        attention.batched_attention = timed("attention", batched_attention)
        batch_cache.BatchedLayer.update = timed("cache update", layer_update)
        model.lm_head.forward = timed("lm_head", lm_head_forward)
    try:
        bench.run_cell(model, {**job, "stage": "closed", "eos": None}, prompts, responses["result"])
    finally:
        speculative.forward_rows, speculative._round, speculative._roll_back_draft = forward_rows, round_, roll_back
        attention.batched_attention, batch_cache.BatchedLayer.update = batched_attention, layer_update
        model.lm_head.forward = lm_head_forward
    total = seconds["round"]
    print(f"{args.dtype}, batch {args.batch}: {calls['verification']} rounds, {total:.1f} s")
    for kind in KINDS:
        print(f"  {kind:<14} {seconds[kind]:6.1f} s  {100 * seconds[kind] / total:5.1f} %  ({calls[kind]} calls)")
        for part in ("attention", "cache update", "lm_head") if args.inside else ():
            share = 100 * inside[(kind, part)] / seconds[kind] if seconds[kind] else 0.0
            print(f"    {part:<12} {inside[(kind, part)]:6.1f} s  {share:5.1f} % of the {kind}s")
    rest = total - sum(seconds[kind] for kind in KINDS)
    print(f"  {'rest of round':<14} {rest:6.1f} s  {100 * rest / total:5.1f} %")
    for step, times in sorted(by_step.items()) if args.by_step else ():
        print(f"  draft step {step:>2}: {1000 * sum(times) / len(times):6.1f} ms mean over {len(times)} rounds")


if __name__ == "__main__":
    main()
