"""GQA folded into the query length: a KV head's query heads as more queries of one SDPA call (no
``enable_gqa``), against SDPA with ``enable_gqa``; SmolLM2-135M's heads (9 query / 3 KV of 64). Draft steps
(one query over a 128-key ring) and a verification (12 queries over 475 keys of a ragged batch, additive
mask). Best of 30 ms, and whether the outputs are equal bit for bit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/gqa_fold.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms  # this folder

SHAPES = ((32, 1, 128), (64, 1, 128), (32, 12, 475))  # rows, queries, keys
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def table_row(rows: int, queries: int, keys: int, dtype: torch.dtype) -> str:
    generator = torch.Generator().manual_seed(rows + queries)
    group = HEADS // KV_HEADS
    query = torch.randn(rows, HEADS, queries, HEAD_DIM, generator=generator).to(dtype)
    key, value = (torch.randn(rows, KV_HEADS, keys, HEAD_DIM, generator=generator).to(dtype) for _ in "kv")
    mask = folded_mask = None
    if queries > 1:
        lengths = torch.tensor([keys - 8 * (row % 16) for row in range(rows)])
        positions = lengths[:, None] - queries + torch.arange(queries)[None]
        visible = torch.arange(keys)[None, None] <= positions[:, :, None]
        mask = torch.zeros(rows, 1, queries, keys, dtype=dtype).masked_fill_(~visible[:, None], float("-inf"))
        folded_mask = mask.repeat(1, 1, group, 1)  # (rows, 1, group * queries, keys), head-major like the queries

    def grouped() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=0.125, enable_gqa=True
        )

    def folded() -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(rows, KV_HEADS, group * queries, HEAD_DIM), key, value, attn_mask=folded_mask, scale=0.125
        )
        return out.view(rows, HEADS, queries, HEAD_DIM)

    same = torch.equal(grouped(), folded())
    old, new = best_ms(grouped, 30), best_ms(folded, 30)
    return f"| {rows} × {queries} × {keys} | {str(dtype)[6:]} | {old:.3f} | {new:.3f} | {old / new:.2f}x | {same} |"


def main() -> None:
    torch.set_num_threads(1)
    print("| rows × queries × keys | dtype | enable_gqa ms | folded ms | speed-up | equal |")
    print("|---|---|---:|---:|---:|---|")
    for dtype in (torch.bfloat16, torch.float32):
        for shape in SHAPES:
            print(table_row(*shape, dtype))


if __name__ == "__main__":
    main()
