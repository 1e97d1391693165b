"""The probe with requests batched as well as arms: throughput at each batch size, and agreement.

    # 4 x 128 tokens, 2 threads
    .venv/bin/python benchmarks/investigations/bench_probe_requests.py
    .venv/bin/python benchmarks/investigations/bench_probe_requests.py --batches 1,2,4,8 --requests 8 --osl 96,128,160

SmolLM2-135M, KV self-speculation, rift-stat B = 256, the default arms. The first ``--requests``
embedded prompts of the 1K ISL bucket, each with its greedy response of a length cycled from
``--osl`` (EOS suppressed), generated once. `probe_requests` probes them all at every batch size
of ``--batches`` (the first is the reference), the sizes in rotating order over ``--repeats``;
the best wall time of each is kept. Each batched result is compared with the reference's, array
by array: at T = 0 the outcomes (greedy agreement, 0 or 1) must be equal, and the other values
may differ only in the last bits a larger batch's float operations change (``--tolerance``), else
the script exits 1. With ``--profile`` each run is timed under cProfile (a few percent slower) and
the seconds spent in the arms' forwards (`_arms_forward`) are printed beside the totals.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # compare_probe.py, a maintained script
from compare_probe import largest_difference  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4", help="requests per batch (the first is the reference)")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--osl", default="128", help="response lengths, cycled over the requests")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest difference allowed in float values")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="model dtype (bfloat16 on a GPU)")
    parser.add_argument(
        "--profile", action="store_true", help="run under cProfile and print the seconds in the arms' forwards"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="print the differences without failing (GPU, bf16: other kernels)"
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    batches = [int(x) for x in args.batches.split(",")]
    lengths = [int(x) for x in args.osl.split(",")]

    from rift_ada.budget import make_policy
    from rift_ada.collectors.datasets import encode_prompt, load_dataset
    from rift_ada.collectors.probe import probe_requests
    from rift_ada.collectors.targets.generate import generate_response
    from rift_ada.memory import cap_heap_growth
    from rift_ada.models import PRESETS, load_model

    cap_heap_growth()
    model, tokenizer = load_model(PRESETS["smollm2-135m"].draft, device=args.device, dtype=args.dtype)
    chosen = [r for r in load_dataset("embedded:small", tokenizer) if r.isl_bucket == 1024][: args.requests]
    policy = make_policy("rift-stat", budget=args.budget)
    eos = getattr(tokenizer, "eos_token_id", None)
    requests = []
    for index, request in enumerate(chosen):
        prompt = encode_prompt(tokenizer, request.prompt_messages)
        osl = lengths[index % len(lengths)]
        response = generate_response(
            model, prompt, max_new_tokens=osl, min_new_tokens=osl, eos_token_id=eos, seed=index
        )
        requests.append((prompt, response))
    n_tokens = sum(len(response) for _, response in requests)
    print(
        f"SmolLM2-135M {args.dtype} on {args.device}, B = {args.budget}, {torch.get_num_threads()} thread(s), "
        f"{len(requests)} requests, "
        f"{n_tokens} response tokens, ISL {min(len(p) for p, _ in requests)}-{max(len(p) for p, _ in requests)}, "
        f"load average {os.getloadavg()[0]:.1f} before",
        flush=True,
    )
    seconds: dict[int, list[float]] = {batch: [] for batch in batches}
    arms_seconds: dict[int, list[float]] = {batch: [] for batch in batches}  # --profile
    results: dict[int, dict[int, object]] = {}
    for repeat in range(args.repeats):
        order = batches[repeat % len(batches) :] + batches[: repeat % len(batches)]
        for batch in order:
            profile = cProfile.Profile() if args.profile else None
            start = time.perf_counter()
            if profile is not None:
                profile.enable()
            results[batch] = dict(probe_requests(model, requests, policy=policy, batch_size=batch))
            if profile is not None:
                profile.disable()
                stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
                arms_seconds[batch].append(
                    sum(entry[3] for (_, _, function), entry in stats.items() if function == "_arms_forward")
                )
            seconds[batch].append(time.perf_counter() - start)
            print(f"  repeat {repeat}, batch {batch}: {seconds[batch][-1]:.1f} s", flush=True)
    reference = batches[0]
    best_reference = min(seconds[reference])
    agree = True
    for batch in batches:
        best = min(seconds[batch])
        outcome_changes = 0
        largest = 0.0
        for index in range(len(requests)):
            a, b = results[reference][index], results[batch][index]
            outcome_changes += int(np.sum(a.outcome != b.outcome))  # type: ignore[attr-defined]
            largest = max(largest, largest_difference(a, b))
        agree &= outcome_changes == 0 and largest <= args.tolerance
        print(
            f"batch {batch:>2}: {best:6.1f} s, {n_tokens / best:5.1f} response tokens/s, "
            f"{best_reference / best:4.2f}x batch {reference}; vs batch {reference}: "
            f"{outcome_changes} outcomes changed, other values differ by at most {largest:.1e}"
        )
        if args.profile:
            arms, arms_reference = min(arms_seconds[batch]), min(arms_seconds[reference])
            print(
                f"          under cProfile: arms' forwards {arms:6.1f} s ({arms / best:.0%} of the run), "
                f"{arms_reference / arms:4.2f}x batch {reference}'s"
            )
    return 0 if agree or args.report_only else 1


if __name__ == "__main__":
    sys.exit(main())
