"""A verification's masked SDPA: the boolean mask expanded to every query head (main before 2026-12-05)
against `rift_ada.attention.sdpa_mask`'s additive mask with one head for all (made once per forward and
shared by its layers). A ragged batch (row i's cache 8 (i mod 16) keys shorter) verifies 12 drafted
positions at once; SmolLM2-135M's heads (9 query / 3 KV of 64). Best of 20 ms per layer, and whether the
outputs are equal bit for bit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/verification_mask.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms  # this folder

from rift_ada.attention import sdpa_mask

HEADS, KV_HEADS, HEAD_DIM, QUERIES, KEYS = 9, 3, 64, 12, 475


def table_row(rows: int, dtype: torch.dtype) -> str:
    generator = torch.Generator().manual_seed(rows)
    query = torch.randn(rows, HEADS, QUERIES, HEAD_DIM, generator=generator).to(dtype)
    key, value = (torch.randn(rows, KV_HEADS, KEYS, HEAD_DIM, generator=generator).to(dtype) for _ in "kv")
    lengths = torch.tensor([KEYS - 8 * (row % 16) for row in range(rows)])
    query_positions = lengths[:, None] - QUERIES + torch.arange(QUERIES)[None]
    visible = (torch.arange(KEYS)[None, None] <= query_positions[:, :, None])[:, None]  # (b, 1, q, n)
    every_head = visible.expand(-1, HEADS, -1, -1).contiguous()
    group = HEADS // KV_HEADS

    def attend(mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=0.125, enable_gqa=True
        )

    additive = sdpa_mask(visible, group, dtype)
    same = torch.equal(attend(every_head), attend(additive))
    old, new = best_ms(lambda: attend(every_head), 20), best_ms(lambda: attend(additive), 20)
    making = best_ms(lambda: sdpa_mask(visible.clone(), group, dtype), 20)
    return f"| {rows} | {str(dtype)[6:]} | {old:.2f} | {new:.2f} | {making:.2f} | {old / new:.2f}x | {same} |"


def main() -> None:
    torch.set_num_threads(1)
    print("| rows | dtype | boolean, every head ms | additive, one head ms | making the additive mask ms "
          "| speed-up | equal |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---|")
    for rows in (16, 32, 64):
        for dtype in (torch.float32, torch.bfloat16):
            print(table_row(rows, dtype))


if __name__ == "__main__":
    main()
