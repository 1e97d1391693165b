"""Would the probe gain from batching requests as well as arms? The per-token cost of its forwards.

    .venv/bin/python benchmarks/investigations/bench_probe_batch.py                 # SmolLM2-135M, 1 thread
    .venv/bin/python benchmarks/investigations/bench_probe_batch.py --threads 2
    .venv/bin/python benchmarks/investigations/bench_probe_batch.py --rows 1,8 --tokens 1 --context 448   # decode steps

The probe (`rift_ada.collectors.probe`) runs, per 8-token stride of one request, one batched
forward of its compressed arms (8 rows × 8 tokens with the default arms) over working sets of
about the budget. Batching R requests would make that forward R × 8 rows. This times the same
shape of forward (rows × 8 new tokens over a cache of ``--context`` tokens per row) at 8 rows
(one request, today) and at 16 and 32 rows (2 and 4 requests), interleaved, and prints the cost
per token relative to 8 rows: the most a request-batched probe could save on its forwards. The
probe's per-arm work outside the forward (rescoring, softmax over the vocabulary) scales with the
rows either way.

With ``--rows 1,8 --tokens 1`` (or ``--tokens 12``, a verification) the same measurement is the
ceiling of batching on this machine: the model's own forward with a plain cache and no rift-ada
code, at batch 8 against batch 1. A batched loop built on that forward cannot gain more per token.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--rows", default="8,16,32", help="batch rows to compare (the first is the reference)")
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per row (the decision stride)")
    parser.add_argument("--context", type=int, default=264, help="cached tokens per row (budget + a stride)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import DynamicCache

    from rift_ada.models import PRESETS, load_model

    model, _ = load_model(PRESETS[args.preset].draft, device="cpu", dtype="float32")
    vocab = model.config.vocab_size
    rows = [int(x) for x in args.rows.split(",")]

    def prefilled(batch: int) -> DynamicCache:
        cache = DynamicCache(config=model.config)
        context = torch.randint(0, vocab, (1, args.context)).expand(batch, -1)
        with torch.no_grad():
            model(input_ids=context, cache=cache, use_cache=True)
        return cache

    caches = {batch: prefilled(batch) for batch in rows}
    new = torch.randint(0, vocab, (1, args.tokens))
    positions = torch.arange(args.context, args.context + args.tokens)[None]
    seconds: dict[int, list[float]] = {batch: [] for batch in rows}
    with torch.no_grad():
        for _ in range(args.repeats):
            for batch in rows:  # interleaved, so drifts of the machine hit every size alike
                cache = caches[batch]
                start = time.perf_counter()
                model(input_ids=new.expand(batch, -1), position_ids=positions.expand(batch, -1), cache=cache)
                seconds[batch].append(time.perf_counter() - start)
                cache.crop(-args.tokens)  # back to the context (negative: tokens to remove)
    print(
        f"probe-shaped forwards: {args.preset} float32, {args.tokens} new tokens per row over {args.context} cached, "
        f"{torch.get_num_threads()} thread(s), median of {args.repeats}"
    )
    reference = statistics.median(seconds[rows[0]]) / (rows[0] * args.tokens)
    for batch in rows:
        per_token = statistics.median(seconds[batch]) / (batch * args.tokens)
        print(
            f"  {batch:>3} rows ({batch // rows[0]} request(s) of {rows[0]} arms): "
            f"{statistics.median(seconds[batch]) * 1e3:7.1f} ms per forward, {per_token * 1e6:6.1f} us per token, "
            f"{reference / per_token:.2f}x the per-token throughput of {rows[0]} rows"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
