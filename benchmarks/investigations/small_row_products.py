"""oneDNN's packed products at a few rows: one to three rows as they are, against padded to `ONEDNN_MIN_ROWS`.

A pass over SmolLM2-135M's Linear shapes (`mkl_packed_float32.py`'s 30 layers and the lm_head, weights packed
for oneDNN as `rift_ada.packed_linear` packs them), bfloat16 and float32, median of 7 passes per row count, the
two ways alternating: the packed op on the rows as they are ("plain"), and `PackedLinear`'s call, which pads
fewer than `ONEDNN_MIN_ROWS` rows with zeros ("padded"). Then, for the down projections (1536 -> 576 and
Gemma3's 2048 -> 640), how many of 64 rows computed alone differ from the same rows of a 64-row product, each way.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/small_row_products.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from mkl_packed_float32 import model_weights  # noqa: E402

from rift_ada.packed_linear import ONEDNN_MIN_ROWS, ROWS_HINT, _padded_product, cpu_vendor  # noqa: E402


def plain(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def padded(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    return _padded_product(x, packed, None, rows) if rows < ONEDNN_MIN_ROWS else plain(x, packed)


def pass_time(way, packed: list[torch.Tensor], widths: list[int], inputs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for copy, width in zip(packed, widths, strict=True):
        way(inputs[width], copy)
    return time.perf_counter() - start


def timing(dtype: torch.dtype, row_counts: tuple[int, ...]) -> None:
    weights = [w.to(dtype) for w in model_weights()]
    widths = [w.shape[1] for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT) for w in weights]
    size = sum(w.numel() * w.element_size() for w in weights)
    del weights
    print(f"{dtype}: one pass over {size / 2**20:.0f} MiB of weights, median of 7 (ms)")
    for rows in row_counts:
        generator = torch.Generator().manual_seed(rows)
        inputs = {k: torch.randn(rows, k, generator=generator).to(dtype) for k in set(widths)}
        times: dict[str, list[float]] = {"plain": [], "padded": []}
        for _ in range(7):
            times["plain"].append(pass_time(plain, packed, widths, inputs))
            times["padded"].append(pass_time(padded, packed, widths, inputs))
        a, b = (statistics.median(times[k]) for k in ("plain", "padded"))
        print(f"  {rows:3d} rows: plain {1e3 * a:6.1f}, padded {1e3 * b:6.1f}  ({a / b:.2f}x)", flush=True)


def rows_alone(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    for fan_in, fan_out in ((1536, 576), (2048, 640)):
        weight = (torch.randn(fan_out, fan_in, generator=generator) * fan_in**-0.5).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)
        x = torch.randn(64, fan_in, generator=generator).to(dtype)
        batch = plain(x, packed)
        counts = {
            way.__name__: sum(not torch.equal(way(x[r : r + 1], packed)[0], batch[r]) for r in range(64))
            for way in (plain, padded)
        }
        print(f"  {dtype} {fan_in} -> {fan_out}: rows alone that differ from the 64-row product: {counts}")


def main() -> None:
    torch.set_num_threads(1)
    print(f"CPU vendor {cpu_vendor() or 'unknown'}; rows under {ONEDNN_MIN_ROWS} run padded to it")
    for dtype in (torch.bfloat16, torch.float32):
        timing(dtype, (1, 2, 3, 4, 5, 6, 8, 16))
    for dtype in (torch.bfloat16, torch.float32):
        rows_alone(dtype)


if __name__ == "__main__":
    main()
