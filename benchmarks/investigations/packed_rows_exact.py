"""At which row counts does a packed bfloat16 product give a row other bits than the row alone?

For each Linear shape of SmolLM2-135M and Gemma3-270M (the lm_head included), a weight packed as
`rift_ada.packed_linear` packs it, 48 random rows: the row counts M (1-48) at which some row of an M-row product
differs from the same row computed alone (M = 1), through `PackedLinear` (so one to three rows run padded to
`ONEDNN_MIN_ROWS`; small_row_products.py compares with and without). A batch gives each request what it gives
alone only where no M up to `ROWS_HINT` (32) is listed (products of more rows run in 32-row pieces inside a
batch's forward).
Run it under ``ONEDNN_MAX_CPU_ISA`` to see another CPU's kernels on this one (AVX512_CORE_BF16: a CPU with
AVX512-BF16 but no AMX, as an AMD Zen 4; ``ONEDNN_VERBOSE=1`` names the kernel taken).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/packed_rows_exact.py
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 OMP_NUM_THREADS=1 \
        .venv/bin/python benchmarks/investigations/packed_rows_exact.py
"""

from __future__ import annotations

import os

import torch

from rift_ada.packed_linear import bfloat16_rows_exact, pack_linear_weights

SHAPES = {
    "smollm2-135m": ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)),
    "gemma3-270m": ((640, 1024), (640, 256), (1024, 640), (640, 2048), (2048, 640), (640, 262144)),
}
MAX_ROWS = 48


def rows_that_differ(fan_in: int, fan_out: int, generator: torch.Generator) -> list[int]:
    """The M (1..MAX_ROWS) at which some row of an M-row packed product differs from that row alone."""
    layer = torch.nn.Sequential(torch.nn.Linear(fan_in, fan_out, bias=False))
    with torch.no_grad():
        layer[0].weight.copy_(torch.randn(fan_out, fan_in, generator=generator) * fan_in**-0.5)
    layer = layer.to(torch.bfloat16)
    if pack_linear_weights(layer) != 1:
        raise SystemExit("nothing packed: this torch build has no oneDNN bfloat16")
    x = torch.randn(MAX_ROWS, fan_in, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        alone = torch.cat([layer(x[row : row + 1]) for row in range(MAX_ROWS)])
        return [rows for rows in range(1, MAX_ROWS + 1) if not torch.equal(layer(x[:rows]), alone[:rows])]


def main() -> None:
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL")
    print(f"ONEDNN_MAX_CPU_ISA={isa}, bfloat16_rows_exact()={bfloat16_rows_exact()}")
    generator = torch.Generator().manual_seed(0)
    for model, shapes in SHAPES.items():
        for fan_in, fan_out in shapes:
            differ = rows_that_differ(fan_in, fan_out, generator)
            first = f"from {differ[0]} rows ({len(differ)} of {MAX_ROWS} row counts)" if differ else "none"
            print(f"{model:<13} {fan_in:>5} -> {fan_out:<7} rows differ: {first}")


if __name__ == "__main__":
    main()
