"""The greedy choice and the entropy signal's division: what they cost on the logits the loops reduce.

`rift_ada.speculative.greedy_tokens` takes ``torch.max``'s indices instead of ``argmax``: both return the first
index of the largest value (ties included, checked here on planted ties), and the CPU's ``max`` kernel is the
faster one. The shapes are a draft step's float32 logits (rows, 49152), a verification's per-row (12, 49152),
and a probe forward's arms (40 arms, 8 positions, 49152) in float32 and bf16. Also timed: dividing float32
logits by T = 1.0, which `entropy_and_probs` skips (the quotient is the dividend, bit for bit).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/greedy_tokens.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms

from rift_ada.speculative import greedy_tokens

VOCAB = 49152  # SmolLM2's
SHAPES = {
    "draft step, 32 rows": (32, VOCAB),
    "draft step, 64 rows": (64, VOCAB),
    "verification, one row's 12 positions": (12, VOCAB),
    "probe forward, 40 arms x 8 positions": (40, 8, VOCAB),
}


def table_row(name: str, shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> str:
    logits = torch.randn(*shape, generator=generator).to(dtype)
    flat = logits.view(-1, VOCAB)
    top = flat.max(-1).values
    flat[::3, 17], flat[::3, 4000] = top[::3] + 1, top[::3] + 1  # a tie for the first place in every third row
    same = torch.equal(logits.argmax(-1), greedy_tokens(logits))
    plain, fast = best_ms(lambda: logits.argmax(-1), 20), best_ms(lambda: greedy_tokens(logits), 20)
    return f"| {name} | {str(dtype)[6:]} | {plain:.3f} | {fast:.3f} | {plain / fast:.2f}x | {same} |"


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    print("| logits | dtype | argmax ms | greedy_tokens ms | speed-up | same indices (ties planted) |")
    print("|---|---|---:|---:|---:|---|")
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            print(table_row(name, shape, dtype, generator))
    logits = torch.randn(32, VOCAB, generator=generator)
    print(f"\nfloat32 (32, {VOCAB}) / 1.0: {best_ms(lambda: logits / 1.0, 20):.3f} ms, "
          f"equal to the dividend: {torch.equal(logits / 1.0, logits)}")  # fmt: skip


if __name__ == "__main__":
    main()
