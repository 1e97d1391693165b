"""Whether torch's CPU SDPA gives the same bits at 1 and 2 threads, for the attention shapes rift-ada's paths call it
with: one call with a boolean mask (the last causal band of a prompt's queries, a verification's or a decode step's
band) and one without, per shape (batch, query heads, KV heads, head dim, queries, keys). The tiny llama's heads
(4 / 2 of 8) and SmolLM2's (9 / 3 of 64). Random inputs, seed 0. ``--scan``: which query counts (1-33, 63, 65, 127,
129) over 300 and 971 keys round differently at 1 and 2 threads, masked; then the library's blocked causal prefill
(`rift_ada.attention._blocked_causal_sdpa`) at 1 and 2 threads over 1,032 shapes (six head layouts, float32 and
bf16, 43 lengths from 65 to 1,024, batch 1 and 2) and at 1-4 threads over 48 more, beside one causal call.

    .venv/bin/python benchmarks/investigations/sdpa_threads.py
    .venv/bin/python benchmarks/investigations/sdpa_threads.py --scan
"""

from __future__ import annotations

import itertools
import sys

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


def at_threads(counts: tuple[int, ...], run, *inputs) -> list[torch.Tensor]:
    """``run(*inputs)`` at each thread count."""
    outputs = []
    for count in counts:
        torch.set_num_threads(count)
        outputs.append(run(*inputs))
    return outputs


def one_causal_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=True
    )


def scan() -> int:
    from rift_ada.attention import _blocked_causal_sdpa

    generator = torch.Generator().manual_seed(0)
    differ: dict[tuple[int, int, int], list[int]] = {}
    for (heads, kv_heads, dim), queries, keys in itertools.product(
        [(4, 2, 8), (9, 3, 64)], [*range(1, 34), 63, 65, 127, 129], [300, 971]
    ):
        query = torch.randn(1, heads, queries, dim, generator=generator)
        key, value = (torch.randn(1, kv_heads, keys, dim, generator=generator) for _ in range(2))
        band = (torch.arange(keys)[None, :] <= (keys - queries + torch.arange(queries))[:, None])[None, None]
        one, two = at_threads((1, 2), attend, query, key, value, band)
        if not torch.equal(one, two):
            differ.setdefault((heads, dim, keys), []).append(queries)
    print("query counts whose masked call differs at 1 and 2 threads, by (heads, head dim, keys):", differ)
    layouts = [(4, 2, 8), (9, 3, 64), (4, 2, 16), (8, 2, 32), (4, 1, 128), (2, 2, 4)]
    lengths = [*range(65, 300, 7), 389, 390, 511, 513, 700, 971, 1008, 1023, 1024]
    shapes, blocked_differ = 0, []
    for (heads, kv_heads, dim), dtype, length, batch in itertools.product(
        layouts, [torch.float32, torch.bfloat16], lengths, [1, 2]
    ):
        query = torch.randn(batch, heads, length, dim, generator=generator).to(dtype)
        key, value = (torch.randn(batch, kv_heads, length, dim, generator=generator).to(dtype) for _ in range(2))
        one, two = at_threads((1, 2), _blocked_causal_sdpa, query, key, value, dim**-0.5)
        shapes += 1
        if not torch.equal(one, two):
            blocked_differ.append((heads, kv_heads, dim, str(dtype)[6:], length, batch))
    print(f"blocked prefills, 1 against 2 threads: {shapes} shapes, differing: {blocked_differ}")
    more, blocked_differ, one_call_differ = 0, [], []
    for (heads, kv_heads, dim), dtype, length in itertools.product(
        layouts[:2] + layouts[3:4], [torch.float32, torch.bfloat16], [65, 100, 131, 255, 390, 513, 971, 1024]
    ):
        query = torch.randn(1, heads, length, dim, generator=generator).to(dtype)
        key, value = (torch.randn(1, kv_heads, length, dim, generator=generator).to(dtype) for _ in range(2))
        blocked = at_threads((1, 2, 3, 4), _blocked_causal_sdpa, query, key, value, dim**-0.5)
        whole = at_threads((1, 2, 3, 4), one_causal_call, query, key, value, dim**-0.5)
        more += 1
        if not all(torch.equal(blocked[0], other) for other in blocked):
            blocked_differ.append((heads, dim, str(dtype)[6:], length))
        if not all(torch.equal(whole[0], other) for other in whole):
            one_call_differ.append((heads, dim, str(dtype)[6:], length))
    print(
        f"1-4 threads, {more} shapes: blocked differing {blocked_differ}, one causal call differing {one_call_differ}"
    )
    return 0


def main() -> int:
    if "--scan" in sys.argv[1:]:
        return scan()
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
