"""How many ATen operators one closed-loop draft step dispatches, by the module that dispatched them.

A `TorchDispatchMode` counts every operator of the ``--step``-th full-batch single-token draft forward
of a closed loop (SmolLM2-135M, the ragged ISL 328-448 prompts of `bench_throughput.py`, their greedy
responses teacher-forced, rift-stat B = 128, K = 11, T = 0, PeriodicRefresh(32), one thread), each
charged to the innermost module running when it dispatched (module forward hooks). Step 1 of the
first round includes the initial selection (every row's SnapKV scoring); later steps are the plain
decode step whose per-operator cost docs/notes/2026-12-05-round-overheads.md estimates.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/draft_step_ops.py --dtype float32 --batch 16 --step 5
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parents[1]))
import bench_throughput as bench  # noqa: E402

import rift_ada.speculative as speculative  # noqa: E402
from rift_ada.memory import cap_heap_growth  # noqa: E402


class OperatorCount(TorchDispatchMode):
    """Counts dispatched operators by (innermost module class, operator name)."""

    def __init__(self, modules: list[str]) -> None:
        super().__init__()
        self.modules = modules
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[(self.modules[-1], func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--step", type=int, default=5, help="which full-batch draft step to count (1 = the first)")
    parser.add_argument("--top", type=int, default=25, help="(module, operator) pairs to list")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cap_heap_growth()
    model, prompts, job, responses = bench.closed_cell_inputs(args.dtype, args.batch, 16)

    modules = ["(outside modules)"]

    def enter(module, positional) -> None:
        modules.append(type(module).__name__)

    def leave(module, positional, output) -> None:  # returns None: a hook's return would replace the output
        modules.pop()

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(enter),
        torch.nn.modules.module.register_module_forward_hook(leave),
    ]
    counter = OperatorCount(modules)
    steps = 0
    forward_rows = speculative.forward_rows

    def counted(model, cache, feeds, starts, logits=True):
        nonlocal steps
        if logits and len(feeds) == args.batch and max(map(len, feeds)) == 1:
            steps += 1
            if steps == args.step:
                with counter:
                    return forward_rows(model, cache, feeds, starts, logits=logits)
        return forward_rows(model, cache, feeds, starts, logits=logits)

    speculative.forward_rows = counted
    try:
        bench.run_cell(model, {**job, "stage": "closed"}, prompts, responses["result"])
    finally:
        speculative.forward_rows = forward_rows
        for hook in hooks:
            hook.remove()
    by_module: collections.Counter[str] = collections.Counter()
    for (module, _), n in counter.counts.items():
        by_module[module] += n
    print(f"draft step {args.step} of {steps}, {args.batch} rows, {args.dtype}: {sum(by_module.values())} operators")
    for module, n in by_module.most_common():
        print(f"  {module:28s} {n:6d}")
    print("by module and operator:")
    for (module, name), n in counter.counts.most_common(args.top):
        print(f"  {module:28s} {name:44s} {n:6d}")


if __name__ == "__main__":
    main()
