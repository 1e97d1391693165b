"""A Linear from a weight packed once for oneDNN (`rift_ada.packed_linear`) against ``F.linear``, on
SmolLM2-135M's Linear shapes (hidden 576, MLP 1536, the 49152-row lm_head), in bfloat16 and float32, at a
decode step's rows and a prefill's: the time of each (best of many), the speed-up, whether the outputs are
equal bit for bit, and whether a row's output is the same computed alone, from the packed weight and from
F.linear (what a batch's identity with each request alone needs: "rows mix" where it is not).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/packed_linear.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms  # this folder

from rift_ada.packed_linear import ROWS_HINT

SHAPES = ((576, 1536), (1536, 576), (576, 576), (576, 49152))  # (in, out)
ROWS = (1, 12, 32, 64, 132, 384, 448)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # whether rows mix depends on the values, so the same ones every run
    print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, rows hint {ROWS_HINT}")
    for dtype in (torch.bfloat16, torch.float32):
        for fan_in, fan_out in SHAPES:
            weight = torch.randn(fan_out, fan_in).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)
            cells = []
            for rows in ROWS:
                x = torch.randn(rows, fan_in).to(dtype)
                tries = 10 if fan_out > 10_000 else 100

                def plain(x=x, weight=weight):
                    return torch.nn.functional.linear(x, weight)

                def from_packed(x=x, packed=packed):
                    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

                speed_up = best_ms(plain, tries) / best_ms(from_packed, tries)
                equal = torch.equal(from_packed(), plain())
                row_alone = torch.equal(from_packed(x[-1:])[0], from_packed()[-1])
                plain_row_alone = torch.equal(plain(x[-1:])[0], plain()[-1])
                notes = ("" if equal else " (differs)") + ("" if row_alone else " (rows mix)")
                notes += "" if plain_row_alone else " (F.linear's rows mix)"
                cells.append(f"{rows}: {speed_up:.2f}x{notes}")
            name = str(dtype).removeprefix("torch.")
            print(f"{name} {fan_in} -> {fan_out}, rows " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
