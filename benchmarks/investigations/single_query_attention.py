"""bf16 single-query attention: `rift_ada.attention._single_query_attention` (the logits GEMM in bf16
on contiguous keys) against the float32-logits path it replaced (float32 upcasts of every key, as
`_attention_probs` still computes for the scorers), on a draft step's ring and on target-generation
steps over a long full cache (keys a strided slice of the stored KV, ragged rows masked), and torch's SDPA
(what a CPU with AMX takes, `rift_ada.attention._sdpa_is_slow`); time (best of 20) and error against a float64
reference (SmolLM2-135M's heads: 9 query / 3 KV of 64).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/single_query_attention.py
"""

from __future__ import annotations

import torch
from bf16_kernels import best_ms  # this folder

from rift_ada.attention import _attention_output, _attention_probs, _single_query_attention

SHAPES = {  # name: (rows, keys, stored capacity, masked)
    "draft step ring": (32, 140, 140, False),
    "target step, 16 rows": (16, 600, 700, True),
    "target step, 32 rows": (32, 600, 700, True),
    "target step, 64 rows": (64, 600, 700, True),
}
SCALING, DRAWS = 0.125, 5


def reference(query, key, value, visible) -> torch.Tensor:
    rows, _, _, head_dim = query.shape
    grouped = query.double().reshape(rows, 3, 3, 1, head_dim)
    logits = torch.einsum("bkgqd,bknd->bkgqn", grouped, key.double()) * SCALING
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    output = torch.einsum("bkgqn,bknd->bkgqd", torch.softmax(logits, -1), value.double())
    return output.reshape(rows, 9, 1, head_dim).transpose(1, 2)


def path_functions(query, key, value, visible) -> dict:
    return {
        "float32 logits": lambda: _attention_output(_attention_probs(query, key, SCALING, visible, None), value),
        "bf16 logits": lambda: _single_query_attention(query, key, value, SCALING, visible),
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=None if visible is None else visible[:, 0], scale=SCALING, enable_gqa=True
        ).transpose(1, 2),
    }


def main() -> None:
    torch.set_num_threads(1)
    print(f"AMX: {torch.cpu._is_amx_tile_supported()}")
    print("shape: float32-logits path ms, bf16-logits ms, sdpa ms; error against float64, max / mean, for each")
    for name, (rows, keys, capacity, masked) in SHAPES.items():
        errors: dict[str, list[torch.Tensor]] = {"float32 logits": [], "bf16 logits": [], "sdpa": []}
        for draw in range(DRAWS):
            generator = torch.Generator().manual_seed(draw)
            query = (torch.randn(rows, 9, 1, 64, generator=generator) * 1.5).bfloat16()
            stored = [(torch.randn(rows, 3, capacity, 64, generator=generator) * s).bfloat16() for s in (1.5, 1.0)]
            key, value = (tensor[:, :, :keys] for tensor in stored)
            visible = None
            if masked:  # ragged rows: row i sees its first keys - 8 (i mod 16) keys
                lengths = torch.tensor([keys - 8 * (row % 16) for row in range(rows)])
                visible = (torch.arange(keys)[None] < lengths[:, None]).reshape(rows, 1, 1, 1, keys)
            exact = reference(query, key, value, visible)
            paths = path_functions(query, key, value, visible)
            for path, fn in paths.items():
                errors[path].append((fn().double() - exact).abs())
            if draw == 0:
                times = {path: best_ms(fn, repeats=20) for path, fn in paths.items()}
        cells = [
            f"{path} {times[path]:.3f} ms, error {max(float(e.max()) for e in errs):.1e} / "
            f"{sum(float(e.mean()) for e in errs) / DRAWS:.1e}"
            for path, errs in errors.items()
        ]
        ratio = times["float32 logits"] / times["bf16 logits"]
        sdpa = times["bf16 logits"] / times["sdpa"]
        print(f"{name} ({rows} rows, {keys} keys): " + "; ".join(cells) + f"; bf16 logits {ratio:.2f}x float32's,"
              f" sdpa {sdpa:.2f}x bf16 logits'")  # fmt: skip


if __name__ == "__main__":
    main()
