"""Does a forward of several new tokens give each token the logits it gets one token at a time?

Replay is exact for a policy that never refreshes at T = 0 only if the probe's teacher-forced chunks (8-token
strides), the closed loop's draft steps (one token) and its verifications (12 tokens) compute each position's
logits alike. This runs the real SmolLM2-135M (plain transformers, `DynamicCache`, its SDPA attention) on a
288-token random prompt, then the next 12 tokens once as one chunk and once as 12 single-token steps, and
prints how many of the 12 positions' logits are equal bit for bit, how many argmaxes agree, and the largest
difference: in float32 and in bfloat16, with SDPA over the whole chunk and with each query of a chunk attending
alone (its own SDPA call over its causal prefix, as a single-token step does); and the time of the chunk's
forward both ways.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/chunk_vs_steps.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
import transformers.integrations.sdpa_attention as sdpa_integration
from transformers import DynamicCache

from rift_ada.models import PRESETS, load_model

PROMPT, CHUNK = 288, 12


@contextmanager
def queries_attend_alone() -> Iterator[None]:
    """transformers' SDPA call, each query of a multi-query call on its own over its causal prefix."""
    sdpa = F.scaled_dot_product_attention

    def per_query(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        n_queries, n_keys = query.shape[-2], key.shape[-2]
        if n_queries == 1 or n_queries == n_keys:  # a step, or the prompt's prefill (the same in both runs)
            return sdpa(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        outputs = []
        for index in range(n_queries):
            end = n_keys - n_queries + index + 1
            outputs.append(
                sdpa(query[..., index : index + 1, :], key[..., :end, :], value[..., :end, :], scale=scale,
                     enable_gqa=enable_gqa)
            )  # fmt: skip
        return torch.cat(outputs, -2)

    sdpa_integration.torch.nn.functional.scaled_dot_product_attention = per_query
    try:
        yield
    finally:
        sdpa_integration.torch.nn.functional.scaled_dot_product_attention = sdpa


def compare(model, ids: torch.Tensor) -> tuple[int, int, float, float]:
    """(positions equal bit for bit, argmaxes equal, largest difference, chunk forward ms)."""
    with torch.no_grad():
        cache = DynamicCache()
        model(ids[:, :PROMPT], past_key_values=cache, use_cache=True)
        started = time.perf_counter()
        chunk = model(ids[:, PROMPT:], past_key_values=cache, use_cache=True).logits[0]
        chunk_ms = 1e3 * (time.perf_counter() - started)
        cache = DynamicCache()
        model(ids[:, :PROMPT], past_key_values=cache, use_cache=True)
        steps = torch.cat(
            [model(ids[:, PROMPT + i : PROMPT + i + 1], past_key_values=cache, use_cache=True).logits[0] for i in
             range(CHUNK)]
        )  # fmt: skip
    equal = sum(torch.equal(chunk[i], steps[i]) for i in range(CHUNK))
    argmax = int((chunk.argmax(-1) == steps.argmax(-1)).sum())
    return equal, argmax, float((chunk.float() - steps.float()).abs().max()), chunk_ms


def main() -> None:
    ids = torch.randint(100, 40000, (1, PROMPT + CHUNK), generator=torch.Generator().manual_seed(0))
    print(f"{'dtype':<9} {'attention':<14} {'logits equal':>12} {'argmax equal':>12} {'max diff':>9} {'chunk ms':>9}")
    for dtype in ("float32", "bfloat16"):
        model, _ = load_model(PRESETS["smollm2-135m"].draft, dtype=dtype)
        model.config._attn_implementation = "sdpa"
        for attention in ("sdpa", "query alone"):
            runs = []
            for _ in range(3):
                if attention == "sdpa":
                    runs.append(compare(model, ids))
                else:
                    with queries_attend_alone():
                        runs.append(compare(model, ids))
            equal, argmax, diff, _ = runs[-1]
            chunk_ms = sorted(run[3] for run in runs)[1]
            print(f"{dtype:<9} {attention:<14} {equal:>9}/{CHUNK} {argmax:>9}/{CHUNK} {diff:>9.2e} {chunk_ms:>9.1f}")


if __name__ == "__main__":
    main()
