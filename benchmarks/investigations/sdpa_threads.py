"""Whether torch's CPU SDPA gives the same bits at 1 and 2 threads, for the attention shapes rift-ada's paths call it
with: one call with a boolean mask (the last causal band of a prompt's queries, a verification's or a decode step's
band) and one without, per shape (batch, query heads, KV heads, head dim, queries, keys). The tiny llama's heads
(4 / 2 of 8) and SmolLM2's (9 / 3 of 64). Random inputs, seed 0.

    .venv/bin/python benchmarks/investigations/sdpa_threads.py
"""

from __future__ import annotations

import torch

SHAPES = (  # (batch, query heads, KV heads, head dim, queries, keys)
    (1, 4, 2, 8, 11, 971),  # the tiny bench's last 64-query block of a 971-token prompt
    (1, 4, 2, 8, 64, 971),
    (1, 9, 3, 64, 12, 2048),  # a verification over a full 2K cache, one request
    (2, 9, 3, 64, 12, 2048),
    (8, 9, 3, 64, 12, 1024),
    (1, 9, 3, 64, 8, 600),
    (1, 9, 3, 64, 1, 2048),  # a decode step over a full 2K cache, one request
    (16, 9, 3, 64, 1, 2048),
)


def attend(query, key, value, mask) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    print("batch  heads  kv  dim  queries  keys   masked: 1 = 2 threads   no mask: 1 = 2 threads")
    for batch, heads, kv_heads, dim, queries, keys in SHAPES:
        query = torch.randn(batch, heads, queries, dim, generator=generator)
        key, value = (torch.randn(batch, kv_heads, keys, dim, generator=generator) for _ in range(2))
        positions = torch.arange(keys)
        band = positions[None, :] <= (keys - queries + torch.arange(queries))[:, None]
        mask = band[None, None].expand(batch, 1, queries, keys)
        same = []
        for given in (mask, None):
            outputs = []
            for threads in (1, 2):
                torch.set_num_threads(threads)
                outputs.append(attend(query, key, value, given))
            same.append(torch.equal(*outputs))
        print(f"{batch:5d}  {heads:5d}  {kv_heads:2d}  {dim:3d}  {queries:7d}  {keys:5d}   {str(same[0]):>21s}   "
              f"{str(same[1]):>22s}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
