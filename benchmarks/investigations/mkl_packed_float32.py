"""float32 products from MKL-packed weights (`rift_ada.packed_linear`) against ``F.linear``: time over a model's
weights streamed from memory, and bit equality, by row count.

Timing: one pass over SmolLM2-135M's Linear shapes (30 layers of q, k, v, o, gate, up, down and the 49152-row
lm_head, 513 MiB of float32: every weight comes from memory, as in a decode step), median of 4 passes, with
the weights packed for the pass's row count. Equality: the packed product against ``F.linear`` at every row
count from 1 to 449, on SmolLM2's and Gemma3-270M's shapes and two tiny ones, seeded inputs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/mkl_packed_float32.py
"""

from __future__ import annotations

import statistics
import time

import torch

LAYER_SHAPES = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))
EQUALITY_SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (640, 640), (2048, 640), (64, 32), (128, 64))


def model_weights(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o, i, generator=generator) for _ in range(30) for o, i in LAYER_SHAPES]
    return weights + [torch.randn(49152, 576, generator=generator)]


def one_pass(weights: list[torch.Tensor], inputs: dict[int, torch.Tensor], packed: list | None, rows: int) -> float:
    start = time.perf_counter()
    if packed is None:
        for weight in weights:
            torch.nn.functional.linear(inputs[weight.shape[1]], weight)
    else:
        for weight, copy in zip(weights, packed, strict=True):
            torch.ops.mkl._mkl_linear(inputs[weight.shape[1]], copy, weight, None, rows)
    return time.perf_counter() - start


def timing(rows_list: tuple[int, ...]) -> None:
    weights = model_weights()
    size = sum(w.numel() * 4 for w in weights)
    print(f"one pass over {size / 2**20:.0f} MiB of float32 weights, median of 4 (ms):")
    print(f"{'rows':>6} {'F.linear':>10} {'packed':>10} {'speed-up':>9}")
    for rows in rows_list:
        generator = torch.Generator().manual_seed(rows)
        inputs = {k: torch.randn(rows, k, generator=generator) for k in (576, 1536)}
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in weights]
        plain = statistics.median(one_pass(weights, inputs, None, rows) for _ in range(5))
        fast = statistics.median(one_pass(weights, inputs, packed, rows) for _ in range(5))
        print(f"{rows:6d} {1e3 * plain:10.1f} {1e3 * fast:10.1f} {plain / fast:8.2f}x", flush=True)
        del packed
    start = time.perf_counter()
    for weight in weights:
        torch.ops.mkl._mkl_reorder_linear_weight(weight, 16)
    print(f"packing every weight once: {1e3 * (time.perf_counter() - start):.0f} ms")


def equality(max_rows: int = 449) -> None:
    generator = torch.Generator().manual_seed(1)
    print(f"row counts (1-{max_rows}) where the packed product differs from F.linear's:")
    for out_features, in_features in EQUALITY_SHAPES:
        weight = torch.randn(out_features, in_features, generator=generator)
        differ = []
        for rows in range(1, max_rows + 1):
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
            x = torch.randn(rows, in_features, generator=generator)
            if not torch.equal(
                torch.ops.mkl._mkl_linear(x, packed, weight, None, rows), torch.nn.functional.linear(x, weight)
            ):
                differ.append(rows)
        print(f"  {out_features} x {in_features}: {differ if differ else 'none'}", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    timing((1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 192))
    equality()


if __name__ == "__main__":
    main()
