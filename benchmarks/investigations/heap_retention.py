"""How much heap a finished stage leaves behind, and how much ``release_free_heap`` gives back.

Runs one bench_throughput cell (targets first, for the responses) on SmolLM2-135M in this process with
the CLI's heap cap, then prints RSS after the cell, after ``gc.collect()`` and after
``rift_ada.memory.release_free_heap()`` (glibc's malloc_trim). Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/heap_retention.py --stage closed --batch 32
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_throughput  # noqa: E402

from rift_ada.memory import cap_heap_growth, release_free_heap  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("closed", "probe", "targets"), default="closed")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--isl", type=int, default=448)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cap_heap_growth()
    setup = argparse.Namespace(quick=False, preset="smollm2-135m", dtype="float32", isl=args.isl, seed=0)
    model, tokenizer = bench_throughput.load(setup)
    prompts = bench_throughput.make_prompts(setup, tokenizer, args.batch)

    def rss() -> str:
        return f"{bench_throughput.rss_gib('VmRSS'):.2f} GiB"

    job = {"batch": args.batch, "budget": 128, "tokens": args.tokens, "eos": None}
    responses = bench_throughput.run_cell(model, {**job, "stage": "targets"}, prompts, None)["result"]
    print("before the cell", rss(), flush=True)
    cell = bench_throughput.run_cell(model, {**job, "stage": args.stage}, prompts, responses)
    print(f"{args.stage} at batch {args.batch}: peak {cell['peak_rss_gib']:.2f} GiB", flush=True)
    del cell
    print("after the cell", rss())
    gc.collect()
    print("after gc.collect()", rss())
    started = time.perf_counter()
    release_free_heap()
    print(f"after release_free_heap() ({time.perf_counter() - started:.2f} s)", rss())


if __name__ == "__main__":
    main()
