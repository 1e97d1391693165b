"""Which kernels give a row a different result in a batch than alone, in float32 and in bfloat16?

A batch equals each request alone bit for bit (tokens, rounds, refreshes at T = 0) in float32, and only in
law in bfloat16 (`bf16_batch_identity.py`). This looks for the kernel behind that, on the tiny models'
shapes (hidden 64, MLP 96, 4 query / 2 KV heads of 16) and SmolLM2-135M's (576, 1536, 9 / 3 of 64):

- ``F.linear``: the last row of an M-row product against the same row alone (M = 1), M from 2 to 399;
- SDPA, one query (a draft step): the row's keys alone against the same keys padded (masked) to a wider
  batch, as a ragged batch pads them;
- SDPA, 5 queries (a verification): the same, keys padded, and keys and queries padded.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/batch_invariance.py
"""

from __future__ import annotations

import torch

LINEAR_SHAPES = {"tiny": ((64, 64), (64, 96), (96, 64)), "smollm2": ((576, 576), (576, 1536), (1536, 576))}
HEADS = {"tiny": (4, 2, 16), "smollm2": (9, 3, 64)}
KEYS, PADS = (20, 60, 140, 600), (1, 5, 17, 64, 200)


def linear_rows_that_differ(fan_in: int, fan_out: int, dtype: torch.dtype, generator: torch.Generator) -> list[int]:
    """The M (2..399) at which an M-row product's last row differs from the row alone."""
    weight = torch.randn(fan_out, fan_in, generator=generator).to(dtype)
    differ = []
    for rows in range(2, 400):
        x = torch.randn(rows, fan_in, generator=generator).to(dtype)
        if not torch.equal(torch.nn.functional.linear(x[-1:], weight)[0], torch.nn.functional.linear(x, weight)[-1]):
            differ.append(rows)
    return differ


def padded_attention_equal(
    heads: tuple[int, int, int], keys: int, queries: int, dtype: torch.dtype, generator: torch.Generator
) -> list[bool]:
    """For each pad in PADS: is SDPA over ``keys`` keys (causal band for several queries) unchanged when the keys
    are padded by ``pad`` masked ones?"""
    n_heads, n_kv, head_dim = heads
    query = torch.randn(1, n_heads, queries, head_dim, generator=generator).to(dtype)
    key, value = (torch.randn(1, n_kv, keys, head_dim, generator=generator).to(dtype) for _ in range(2))
    mask = torch.ones(1, 1, queries, keys, dtype=torch.bool).tril(keys - queries)
    alone = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    same = []
    for pad in PADS:
        filler = torch.randn(1, n_kv, pad, head_dim, generator=generator).to(dtype)
        padded_mask = torch.cat([mask, torch.zeros(1, 1, queries, pad, dtype=torch.bool)], -1)
        got = torch.nn.functional.scaled_dot_product_attention(
            query, torch.cat([key, filler], 2), torch.cat([value, filler], 2), attn_mask=padded_mask, enable_gqa=True
        )
        same.append(torch.equal(got, alone))
    return same


def main() -> None:
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        generator = torch.Generator().manual_seed(0)
        for shapes, pairs in LINEAR_SHAPES.items():
            for fan_in, fan_out in pairs:
                differ = linear_rows_that_differ(fan_in, fan_out, dtype, generator)
                print(f"{name} F.linear {shapes} {fan_in} -> {fan_out}: a row differs from alone at {len(differ)} of "
                      f"398 batch sizes {differ[:8]}{' ...' if len(differ) > 8 else ''}", flush=True)  # fmt: skip
        for shapes, heads in HEADS.items():
            for queries in (1, 5):
                cells = []
                for keys in KEYS:
                    same = padded_attention_equal(heads, keys, queries, dtype, generator)
                    cells.append(f"{keys} keys {''.join('=' if s else 'x' for s in same)}")
                print(f"{name} SDPA {shapes}, {queries} quer{'y' if queries == 1 else 'ies'}, padded by {PADS} "
                      f"('=' unchanged, 'x' differs): " + ", ".join(cells), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
