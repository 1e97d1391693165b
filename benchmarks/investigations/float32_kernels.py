"""float32 products on this CPU: ``F.linear`` against MKL's packed weights (packed per row count) and oneDNN's
(packed once), over SmolLM2-135M's weights streamed from memory, and how oneDNN's rows depend on the batch.

Timing: one pass over SmolLM2-135M's Linear shapes (`mkl_packed_float32.py`'s 30 layers and the lm_head,
513 MiB of float32), median of 5 passes, by row count, and the lm_head alone. Rows: for each shape, whether row
i of an M-row oneDNN product equals row i of the same inputs' 2-row product (M >= 2) and the row alone (M = 1),
and the largest difference from the float64 product. `rift_ada.packed_linear.float32_packing` picks the kernel
from the CPU's vendor; this script is the measurement behind that rule.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/float32_kernels.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from mkl_packed_float32 import EQUALITY_SHAPES, model_weights  # noqa: E402

from rift_ada.packed_linear import ROWS_HINT, cpu_vendor  # noqa: E402

KERNELS = ("F.linear", "mkl", "onednn")


def product(kernel: str, weight: torch.Tensor, packed: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if kernel == "mkl":
        return torch.ops.mkl._mkl_linear(x, packed, weight, None, x.shape[0])
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return torch.nn.functional.linear(x, weight)


def packed_weights(kernel: str, weights: list[torch.Tensor], rows: int) -> list[torch.Tensor | None]:
    if kernel == "mkl":
        return [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in weights]
    if kernel == "onednn":
        return [torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT) for w in weights]
    return [None] * len(weights)


def pass_time(kernel: str, weights: list[torch.Tensor], packed: list, inputs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for weight, copy in zip(weights, packed, strict=True):
        product(kernel, weight, copy, inputs[weight.shape[1]])
    return time.perf_counter() - start


def timing(rows_list: tuple[int, ...]) -> None:
    weights = model_weights()
    size = sum(w.numel() * 4 for w in weights)
    print(f"CPU vendor {cpu_vendor() or 'unknown'}; one pass over {size / 2**20:.0f} MiB of float32 weights, "
          "median of 5 (ms); the lm_head alone in brackets")  # fmt: skip
    print(f"{'rows':>6} " + " ".join(f"{k:>18}" for k in KERNELS) + "   onednn/mkl")
    for rows in rows_list:
        generator = torch.Generator().manual_seed(rows)
        inputs = {k: torch.randn(rows, k, generator=generator) for k in (576, 1536)}
        cells = {}
        for kernel in KERNELS:
            packed = packed_weights(kernel, weights, rows)
            whole = statistics.median(pass_time(kernel, weights, packed, inputs) for _ in range(5))
            head = statistics.median(pass_time(kernel, weights[-1:], packed[-1:], inputs) for _ in range(5))
            cells[kernel] = (whole, head)
            del packed
        line = " ".join(f"{1e3 * w:9.1f} ({1e3 * h:5.1f})" for w, h in cells.values())
        speedup = cells["mkl"][0] / cells["onednn"][0]
        print(f"{rows:6d} {line}   {speedup:.2f}x (lm_head {cells['mkl'][1] / cells['onednn'][1]:.2f}x)", flush=True)


def rows(row_counts: tuple[int, ...] = (1, 2, 3, 4, 8, 16, 17, 32, 64, 192, 449)) -> None:
    generator = torch.Generator().manual_seed(1)
    print("oneDNN float32: row counts whose first rows differ from the 2-row product's (1: from the row alone)")
    for out_features, in_features in EQUALITY_SHAPES:
        weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)
        x = torch.randn(max(row_counts), in_features, generator=generator)
        pair = product("onednn", weight, packed, x[:2])
        differ = []
        for count in row_counts:
            out = product("onednn", weight, packed, x[:count])
            reference = pair[:1] if count == 1 else pair
            if not torch.equal(out[: min(count, 2)], reference[: min(count, 2)]):
                differ.append(count)
        error = (product("onednn", weight, packed, x[:16]).double() - x[:16].double() @ weight.double().T).abs().max()
        print(f"  {out_features} x {in_features}: {differ if differ else 'none'}; max |error| at 16 rows {error:.1e}")


def main() -> None:
    torch.set_num_threads(1)
    timing((1, 2, 4, 8, 16, 32, 64, 192))
    rows()


if __name__ == "__main__":
    main()
