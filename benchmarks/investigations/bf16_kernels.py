"""float32 against bfloat16 on this CPU: the MLP GEMM rate, and attention on a draft step's and a
verification's shapes (SmolLM2-135M: hidden 576, MLP 1536, 9 query / 3 KV heads of 64): torch's SDPA,
SDPA on float32 upcasts, the float32-logits path rift_ada.attention took for one bf16 query until
2026-12-04 (float32 logits and softmax, the values GEMM in the dtype) and the same with the logits GEMM
in the dtype too (what it takes since: `single_query_attention.py` compares the two, with their errors).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/bf16_kernels.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench_throughput import measure_gemm  # noqa: E402

from rift_ada.attention import _attention_output, _attention_probs  # noqa: E402

SHAPES = {  # (rows, queries, keys)
    "draft step": (32, 1, 140),
    "draft step, 16 rows": (16, 1, 140),
    "probe arms, 16 requests": (176, 8, 136),
    "canonical pass": (16, 8, 460),
    "verification": (32, 12, 460),
}


LINEARS = ((576, 576), (576, 1536), (1536, 576), (576, 49152))  # q/o projection, MLP up and down, lm_head


def best_ms(fn, repeats: int = 10) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def attention_ms(rows: int, queries: int, keys: int, dtype: torch.dtype) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, 9, queries, 64, generator=generator).to(dtype)
    key, value = (torch.randn(rows, 3, keys, 64, generator=generator).to(dtype) for _ in range(2))
    mask = torch.rand(rows, 1, queries, keys, generator=generator) > 0.1
    mask[..., 0] = True
    if queries == 1:  # as in rift_ada: a single query sees every gathered key
        mask[:] = True
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def dtype_logits() -> torch.Tensor:  # both GEMMs in dtype, the softmax in float32
        grouped = query.reshape(rows, 3, 3 * queries, 64)
        logits = torch.matmul(grouped * 0.125, key.transpose(-1, -2)).float()
        logits = logits.reshape(rows, 3, 3, queries, keys).masked_fill(~mask[:, :, None], float("-inf"))
        probs = torch.softmax(logits, -1).to(dtype).reshape(rows, 3, 3 * queries, keys)
        return torch.matmul(probs, value)

    sdpa_mask, visible = (None, None) if queries == 1 else (mask, mask[:, :, None])
    return {
        "sdpa": best_ms(lambda: sdpa(query, key, value, attn_mask=sdpa_mask, enable_gqa=True)),
        "sdpa on float32": best_ms(
            lambda: sdpa(query.float(), key.float(), value.float(), attn_mask=sdpa_mask, enable_gqa=True).to(dtype)
        ),
        # rift_ada.attention's path for one bf16 query per row until 2026-12-04 (float32 logits and softmax)
        "float32-softmax path": best_ms(
            lambda: _attention_output(_attention_probs(query, key, 0.125, visible, None), value)
        ),
        "logits in dtype too": best_ms(dtype_logits),
    }


def main() -> None:
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        rates = measure_gemm(576, 1536, dtype)
        gemms = ", ".join(f"M={m}: {r / 1e9:.0f}" for m, r in rates.items())
        print(f"{dtype}: GEMM (576 x 1536) {gemms} GFLOP/s")
        for hidden, out in LINEARS:  # a batch-32 draft step's M, the bench's best-rate M, a verification's
            rates = measure_gemm(hidden, out, dtype, rows=(32, 64, 384))
            print(f"  GEMM ({hidden} x {out}) " + ", ".join(f"M={m}: {r / 1e9:.0f}" for m, r in rates.items()))
        for name, shape in SHAPES.items():
            times = attention_ms(*shape, dtype)
            print(f"  {name} {shape}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()))


if __name__ == "__main__":
    main()
