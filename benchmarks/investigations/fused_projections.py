"""q, k and v as one packed bf16 product, and gate and up as one, against separate packed products
(`rift_ada.packed_linear`'s oneDNN ops), over 30 layers' distinct weights so that they stream from memory as
in a forward; SmolLM2-135M's shapes (576 → 576 / 192 / 192, 576 → 1536 × 2). Best of 10 ms for the 30 layers,
and whether the fused product's columns equal the separate products' bit for bit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/fused_projections.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms  # this folder

LAYERS = 30
GROUPS = {"q, k, v": (576, 192, 192), "gate, up": (1536, 1536)}


def packed(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, 32)


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def table_row(name: str, outputs: tuple[int, ...], rows: int, generator: torch.Generator) -> str:
    x = torch.randn(rows, 576, generator=generator).bfloat16()
    layers = [[torch.randn(out, 576, generator=generator).bfloat16() for out in outputs] for _ in range(LAYERS)]
    separate = [[packed(weight) for weight in layer] for layer in layers]
    fused = [packed(torch.cat(layer, 0)) for layer in layers]

    def run_separate() -> None:
        for layer in separate:
            for weight in layer:
                product(x, weight)

    def run_fused() -> None:
        for weight in fused:
            product(x, weight)

    same = torch.equal(torch.cat([product(x, weight) for weight in separate[0]], -1), product(x, fused[0]))
    old, new = best_ms(run_separate, 10), best_ms(run_fused, 10)
    return f"| {name} | {rows} | {old:.2f} | {new:.2f} | {old / new:.2f}x | {same} |"


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    print("| products | rows | separate ms | fused ms | speed-up | equal |")
    print("|---|---:|---:|---:|---:|---|")
    for rows in (16, 32, 64):
        for name, outputs in GROUPS.items():
            print(table_row(name, outputs, rows, generator))


if __name__ == "__main__":
    main()
