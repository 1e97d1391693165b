"""Does torch.compile of SmolLM2's per-layer MLPs and RMSNorms (regional: the elementwise work around the
GEMMs, fused by inductor) pay on this CPU? Times a plain batched decode forward (one new token per row over
a DynamicCache of 448 tokens) eager against compiled, in float32 and bfloat16, and checks the logits agree.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/compile_mlp.py
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from rift_ada.models import PRESETS, load_model

ROWS, CONTEXT = 32, 448  # a batch-32 draft step's rows over a longer context than the budget


def decode_ms(model, cache: DynamicCache, step: torch.Tensor, repeats: int = 5) -> tuple[float, torch.Tensor]:
    """Best time of one decode forward over the prefilled ``cache`` (the fed token dropped again after each)."""
    best, logits = float("inf"), None
    for _ in range(repeats + 1):
        with torch.no_grad():
            start = time.perf_counter()
            logits = model(input_ids=step, cache=cache, use_cache=True).logits
            best = min(best, time.perf_counter() - start)
        cache.crop(-step.shape[1])  # drop the fed token again
    return best * 1e3, logits


def main() -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    for dtype in ("float32", "bfloat16"):
        model, _ = load_model(PRESETS["smollm2-135m"].draft, device="cpu", dtype=dtype)
        ids = torch.randint(0, model.config.vocab_size, (ROWS, CONTEXT), generator=generator)
        step = torch.randint(0, model.config.vocab_size, (ROWS, 1), generator=generator)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        eager, reference = decode_ms(model, cache, step)
        for layer in model.model.layers:
            layer.mlp = torch.compile(layer.mlp, dynamic=True)
            layer.input_layernorm = torch.compile(layer.input_layernorm, dynamic=True)
            layer.post_attention_layernorm = torch.compile(layer.post_attention_layernorm, dynamic=True)
        start = time.perf_counter()
        decode_ms(model, cache, step, repeats=0)
        compile_s = time.perf_counter() - start
        compiled, logits = decode_ms(model, cache, step)
        error = (logits.float() - reference.float()).abs().max().item()
        print(
            f"{dtype}: decode step at batch {ROWS}: eager {eager:.1f} ms, compiled {compiled:.1f} ms "
            f"({eager / compiled:.2f}x), first compiled call {compile_s:.0f} s, max |logit diff| {error:.2e}"
        )


if __name__ == "__main__":
    main()
