"""Batch 8 vs batch 1 on the embedded model: target generation and the closed draft/verify loop.

    .venv/bin/python benchmarks/investigations/bench_batch.py                   # 8 requests, 96 output tokens, B = 256
    .venv/bin/python benchmarks/investigations/bench_batch.py --tokens 48 --isl 384 --dtype bfloat16
    # + continuous batching, mixed ALs
    .venv/bin/python benchmarks/investigations/bench_batch.py --requests 16 --mixed

Both variants run the same requests in the same process, interleaved (batch 1 = one request at a
time through the same functions), and must give the same tokens; the ratio of their tokens/s is
what `docs/notes/2026-12-01-performance-history.md` records ("Batches"; current figures:
`benchmarks/bench_throughput.py`). Wall time includes each request's prefill (a
request prefills alone in both variants), so the ratio is an end-to-end one.
With ``--requests`` above ``--batch`` the closed loop also runs with continuous batching (a
finished request's slot goes to the next waiting one) beside lockstep batches of the same size.
Torch runs on 1 thread by default (a shared 2-core machine); the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def _prompts(tokenizer, count: int, isl: int) -> list[list[int]]:
    from rift_ada.collectors.datasets import encode_prompt, load_dataset

    prompts = [encode_prompt(tokenizer, r.prompt_messages)[-isl:] for r in load_dataset("embedded:small", tokenizer)]
    if not prompts:
        raise SystemExit("embedded:small gave no prompts")
    # Vary the lengths so the batch is ragged: request i keeps isl - 16 i tokens.
    return [prompts[i % len(prompts)][16 * i :] for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96, help="output tokens per request")
    parser.add_argument("--isl", type=int, default=512, help="prompt tokens (longest request)")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--refresh", type=int, default=32, help="periodic refresh interval of the closed loop")
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="every other closed-loop request never refreshes (stat): mixed ALs, as a confirmation's policies give",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    from rift_ada.budget import make_policy
    from rift_ada.collectors.targets.generate import ResponseRequest, generate_responses
    from rift_ada.memory import cap_heap_growth
    from rift_ada.models import PRESETS, load_model
    from rift_ada.speculative import (
        FULL_POLICY,
        BatchRequest,
        PeriodicRefresh,
        _start_row,
        row_cache,
        speculative_generate_batch,
    )

    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)
    load_before = os.getloadavg()[0]
    model, tokenizer = load_model(PRESETS[args.preset].draft, device=args.device, dtype=args.dtype)
    prompts = _prompts(tokenizer, args.requests, args.isl)
    asks = [ResponseRequest(p, args.tokens, args.seed + i) for i, p in enumerate(prompts)]

    def targets(batch: int) -> tuple[float, list[list[int]]]:
        start, out = time.perf_counter(), []
        for first in range(0, len(asks), batch):
            out += generate_responses(model, asks[first : first + batch], temperature=args.temperature)
        return time.perf_counter() - start, out

    gen = {batch: targets(batch) for batch in (1, args.batch)}
    responses = gen[1][1]
    policy = make_policy("rift-stat", budget=args.budget)

    def closed(batch: int, continuous: bool = False) -> tuple[float, list]:
        requests = [
            BatchRequest(
                p,
                policy,
                seed=args.seed + i,
                refresh_hook=None if args.mixed and i % 2 else PeriodicRefresh(args.refresh),
                forced_tokens=r,
            )
            for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
        ]
        start = time.perf_counter()
        if continuous:
            out = speculative_generate_batch(model, requests, temperature=args.temperature, max_batch=batch)
            return time.perf_counter() - start, out
        out = []
        for first in range(0, len(requests), batch):
            out += speculative_generate_batch(model, requests[first : first + batch], temperature=args.temperature)
        return time.perf_counter() - start, out

    loop = {batch: closed(batch) for batch in (1, args.batch)}
    if args.requests > args.batch:  # continuous batching: a finished request's slot goes to the next one
        loop["continuous"] = closed(args.batch, continuous=True)
    start = time.perf_counter()  # the prefills both variants pay (draft; the target shares it)
    for prompt in prompts:
        _start_row(model, model, BatchRequest(prompt, policy), torch.device(args.device))
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()  # target generation's prefills (one full-KV forward per prompt)
    with torch.no_grad():
        for prompt in prompts:
            model(input_ids=torch.tensor([prompt], device=args.device), cache=row_cache(model, FULL_POLICY))
    target_prefill_s = time.perf_counter() - start
    load_after = os.getloadavg()[0]

    n_tokens = sum(len(r) for r in responses)
    print(
        f"batches: {args.preset} {args.dtype} on {args.device}, {args.requests} requests (ISL {min(map(len, prompts))}-"
        f"{max(map(len, prompts))}), {args.tokens} output tokens each, T = {args.temperature}, "
        f"{torch.get_num_threads()} thread(s), load average {load_before:.1f} before / {load_after:.1f} after"
    )
    same_targets = sum(a == b for a, b in zip(gen[1][1], gen[args.batch][1], strict=True))
    print(
        f"  target generation: batch 1 {n_tokens / gen[1][0]:.1f} tok/s, batch {args.batch} "
        f"{n_tokens / gen[args.batch][0]:.1f} tok/s: ratio {gen[1][0] / gen[args.batch][0]:.2f}x "
        f"(goal >= 4x); identical responses {same_targets}/{len(asks)}"
    )
    decode = {batch: gen[batch][0] - target_prefill_s for batch in gen}
    print(
        f"  target generation without the {target_prefill_s:.1f} s of prefills (measured separately): batch 1 "
        f"{n_tokens / decode[1]:.1f} tok/s, batch {args.batch} {n_tokens / decode[args.batch]:.1f} tok/s: "
        f"ratio {decode[1] / decode[args.batch]:.2f}x"
    )
    single, batched = loop[1][1], loop[args.batch][1]
    same = sum(a.tokens == b.tokens and [r.accepted for r in a.rounds] == [r.accepted for r in b.rounds]
               for a, b in zip(single, batched, strict=True))  # fmt: skip
    mean_al = sum(r.acceptance_length for r in single) / len(single)
    print(
        f"  closed loop (rift-stat B = {args.budget}, periodic:{args.refresh}{' / stat' if args.mixed else ''}, "
        f"teacher-forced, mean AL {mean_al:.2f}): "
        f"batch 1 {n_tokens / loop[1][0]:.1f} tok/s, batch {args.batch} {n_tokens / loop[args.batch][0]:.1f} tok/s: "
        f"ratio {loop[1][0] / loop[args.batch][0]:.2f}x (goal >= 4x); identical runs {same}/{len(single)}"
    )
    if "continuous" in loop:
        same = sum(a.tokens == b.tokens for a, b in zip(single, loop["continuous"][1], strict=True))
        continuous_s = loop["continuous"][0]
        print(
            f"  closed loop, continuous batching ({args.batch} slots, {args.requests} requests): "
            f"{n_tokens / continuous_s:.1f} tok/s: ratio {loop[1][0] / continuous_s:.2f}x to batch 1, "
            f"{loop[args.batch][0] / continuous_s:.2f}x to lockstep batches of {args.batch}; identical runs "
            f"{same}/{len(single)}"
        )
    decode = {batch: loop[batch][0] - prefill_s for batch in loop}
    print(
        f"  closed loop without the {prefill_s:.1f} s of prefills (measured separately): batch 1 "
        f"{n_tokens / decode[1]:.1f} tok/s, batch {args.batch} {n_tokens / decode[args.batch]:.1f} tok/s: "
        f"ratio {decode[1] / decode[args.batch]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
