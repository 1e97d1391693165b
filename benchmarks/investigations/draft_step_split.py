"""Where a closed-loop draft step's time goes between Python, operator dispatch and the products.

The same ragged SmolLM2-135M closed loop as `draft_step_ops.py` (ISL 328-448 prompts, greedy responses
teacher-forced, rift-stat B = 128, K = 11, T = 0, PeriodicRefresh(32), one thread). Three timings of
the plain full-batch single-token draft step:

- **eager**: the step as the loop runs it (the median over the full-batch draft steps after the
  ``--step``-th: a median, so the few steps that also rescore a row do not move it);
- **replay**: the ``--step``-th step's ATen operators, recorded with a `TorchDispatchMode`, called
  again one after another on their recorded inputs (no modules, no transformers or cache Python;
  each call still crosses from Python into the dispatcher);
- **products only**: the replay of just its matrix products and attention kernels;

beside the time of streaming the Linears' weights once at a large copy's bandwidth, measured in the run.

eager - replay is the Python around the operators (modules, hooks, the cache's methods); replay -
products is the dispatch and kernels of the small operators (norms, RoPE, views, adds, cache writes).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/draft_step_split.py --dtype float32 --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parents[1]))
import bench_throughput as bench  # noqa: E402

import rift_ada.speculative as speculative  # noqa: E402
from rift_ada.memory import cap_heap_growth  # noqa: E402

PRODUCTS = (
    "mm",
    "addmm",
    "bmm",
    "matmul",
    "linear",
    "_linear_pointwise",
    "_mkl_linear",
    "scaled_dot_product",
    "_scaled_dot_product",
)


class Recorder(TorchDispatchMode):
    """Keeps every dispatched operator with its inputs, to be called again later."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def is_product(func) -> bool:
    name = func.overloadpacket.__name__
    return any(name.startswith(prefix) for prefix in PRODUCTS)


def replay(calls: list[tuple], repeats: int) -> float:
    """Median seconds of calling ``calls`` in order, over ``repeats`` passes."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for func, args, kwargs in calls:
            func(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def replay_by_operator(calls: list[tuple], repeats: int) -> dict[str, float]:
    """Median seconds per operator name over ``repeats`` timed passes, each call timed alone."""
    passes: list[dict[str, float]] = []
    for _ in range(repeats):
        totals: dict[str, float] = {}
        for func, args, kwargs in calls:
            start = time.perf_counter()
            func(*args, **kwargs)
            name = func.overloadpacket.__name__
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
        passes.append(totals)
    return {name: statistics.median(p[name] for p in passes) for name in passes[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--step", type=int, default=5, help="the full-batch draft step to record (1 = the first)")
    parser.add_argument("--tokens", type=int, default=32, help="response tokens per request")
    parser.add_argument("--repeats", type=int, default=15, help="replay passes (median)")
    parser.add_argument("--top", type=int, default=12, help="operators to list by replay time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cap_heap_growth()
    model, prompts, job, responses = bench.closed_cell_inputs(args.dtype, args.batch, args.tokens)

    recorder = Recorder()
    eager: list[float] = []  # seconds of the full-batch steps after --step
    steps = 0
    forward_rows = speculative.forward_rows

    def timed(model, cache, feeds, starts, logits=True):
        nonlocal steps
        if not (logits and len(feeds) == args.batch and max(map(len, feeds)) == 1):
            return forward_rows(model, cache, feeds, starts, logits=logits)
        steps += 1
        if steps == args.step:
            with recorder:
                return forward_rows(model, cache, feeds, starts, logits=logits)
        if steps < args.step:
            return forward_rows(model, cache, feeds, starts, logits=logits)
        start = time.perf_counter()
        out = forward_rows(model, cache, feeds, starts, logits=logits)
        eager.append(time.perf_counter() - start)
        return out

    speculative.forward_rows = timed
    try:
        bench.run_cell(model, {**job, "stage": "closed"}, prompts, responses["result"])
    finally:
        speculative.forward_rows = forward_rows
    calls = recorder.calls
    products = [call for call in calls if is_product(call[0])]
    eager_ms = 1e3 * statistics.median(eager)
    replay_ms = 1e3 * replay(calls, args.repeats)
    product_ms = 1e3 * replay(products, args.repeats)
    print(
        f"{args.dtype}, {args.batch} rows, step {args.step} recorded: {len(calls)} operators, {len(products)} products"
    )
    print(f"eager draft step (median of {len(eager)} full-batch steps after it): {eager_ms:8.1f} ms")
    print(f"replay of its operators:                                   {replay_ms:8.1f} ms")
    print(f"replay of its products and attention only:                 {product_ms:8.1f} ms")
    weight_bytes = sum(
        module.weight.numel() * module.weight.element_size()
        for module in model.modules()
        if isinstance(module, torch.nn.Linear)
    )
    bandwidth = bench.measure_bandwidth()
    print(
        f"its Linears' weights streamed once: {weight_bytes / 2**20:.0f} MiB, at the copy bandwidth measured now"
        f" ({bandwidth / 1e9:.1f} GB/s): {1e3 * weight_bytes / bandwidth:8.1f} ms"
    )
    small = len(calls) - len(products)
    print(f"python around the operators (eager - replay):               {eager_ms - replay_ms:8.1f} ms")
    print(
        f"small operators (replay - products):                       {replay_ms - product_ms:8.1f} ms"
        f" ({1e3 * (replay_ms - product_ms) / max(small, 1):.1f} us each over {small})"
    )

    by_operator = replay_by_operator(calls, args.repeats)
    counts: dict[str, int] = {}
    for func, _, _ in calls:
        counts[func.overloadpacket.__name__] = counts.get(func.overloadpacket.__name__, 0) + 1
    print("replay by operator, each call timed alone (ms, calls, us a call):")
    for name, seconds in sorted(by_operator.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {name:48s} {1e3 * seconds:8.2f} {counts[name]:6d} {1e6 * seconds / counts[name]:8.1f}")


if __name__ == "__main__":
    main()
