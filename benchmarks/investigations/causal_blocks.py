"""A square causal prefill's attention: one causal SDPA call (torch's CPU flash attention) against the library's
blocks (`rift_ada.attention._blocked_causal_sdpa`: one call per 64 queries over their keys so far, the last block taking
the remainder), over prompt lengths, in float32 and bfloat16; time (best of 3 rounds) and the largest difference from
the one call (SmolLM2-135M's heads: 9 query / 3 KV of 64, one thread). docs/notes/2026-12-07-probe-prefill-blocks.md
and docs/notes/2026-12-07-thread-invariant-prefill-blocks.md.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/causal_blocks.py
"""

from __future__ import annotations

import time

import torch

from rift_ada.attention import _blocked_causal_sdpa

LENGTHS = (128, 256, 390, 512, 700, 1024, 1536, 2048)
SCALING = 0.125


def best_ms(run, inputs: tuple[torch.Tensor, ...], calls: int = 10, rounds: int = 3) -> float:
    run(*inputs)
    times = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            run(*inputs)
        times.append((time.process_time() - start) / calls * 1e3)
    return min(times)


def one_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=SCALING, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous()


def blocked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _blocked_causal_sdpa(query, key, value, SCALING)


def main() -> int:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    print("dtype       length   one call ms   blocks ms   speed-up   max |difference|")
    for dtype in (torch.float32, torch.bfloat16):
        for length in LENGTHS:
            query, key, value = (
                torch.randn(1, heads, length, 64, generator=generator).to(dtype) for heads in (9, 3, 3)
            )
            whole = best_ms(one_call, (query, key, value))
            blocks = best_ms(blocked, (query, key, value))
            difference = one_call(query, key, value).float() - blocked(query, key, value).float()
            print(f"{str(dtype)[6:]:10s}  {length:6d}   {whole:11.2f}   {blocks:9.2f}   {whole / blocks:7.2f}x   "
                  f"{difference.abs().max():.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
