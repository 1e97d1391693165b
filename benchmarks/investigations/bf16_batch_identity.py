"""Does a batch still equal each request alone when the model runs in bfloat16?

Tiny models (default): the 32 ragged requests of
`tests/test_batch.py::test_batches_of_16_and_32_equal_each_request_alone` on each tiny architecture cast to
bfloat16. ``--model smollm2-135m`` (or another preset): 32 ragged random-token prompts of 40-257 tokens under
four policies (RIFT-stat, SnapKV, RIFT-dyn with a refresh every 16 tokens, full), ``--new-tokens`` each,
K = 11, the real model loaded in bfloat16 (its Linears packed for oneDNN). Both at T = 0 and T = 1, batches
of 16 and 32; prints the requests whose tokens, accepted counts or refreshes differ from the request alone.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/bf16_batch_identity.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/bf16_batch_identity.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from test_batch import _ragged_requests  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from rift_ada.budget import make_policy  # noqa: E402
from rift_ada.speculative import BatchRequest, speculative_generate_batch  # noqa: E402

ARCHITECTURES = ("llama", "qwen3_5", "nemotron_h", "gpt_oss", "gemma3_text")


def outcome(result) -> tuple:
    return result.tokens, [r.accepted for r in result.rounds], [r.refreshed for r in result.rounds]


def real_model_requests(new_tokens: int) -> list[BatchRequest]:
    """32 ragged random-token prompts (40-257 tokens), four policies, ``new_tokens`` each."""
    policies = [make_policy("rift-stat", budget=64, obs_window=16), make_policy("snapkv", budget=48, obs_window=16),
                make_policy("rift-dyn", budget=64, obs_window=16, refresh_interval=16),
                make_policy("full")]  # fmt: skip
    made = []
    for index in range(32):
        prompt = torch.randint(100, 40000, (40 + 7 * index,), generator=torch.Generator().manual_seed(100 + index))
        made.append(BatchRequest(prompt.tolist(), policies[index % 4], max_new_tokens=new_tokens, seed=index))
    return made


def compare(label: str, model: Any, requests: Callable[[], list[BatchRequest]], draft_length: int) -> None:
    for temperature in (0.0, 1.0):
        started = time.monotonic()
        alone = [outcome(speculative_generate_batch(model, [r], draft_length=draft_length, temperature=temperature)[0])
                 for r in requests()]  # fmt: skip
        alone_seconds = time.monotonic() - started
        for max_batch in (16, 32):
            started = time.monotonic()
            batched = speculative_generate_batch(
                model, requests(), draft_length=draft_length, temperature=temperature, max_batch=max_batch
            )
            differ = [i for i, got in enumerate(batched) if outcome(got) != alone[i]]
            print(f"{label} T={temperature:g} batch {max_batch}: {len(differ)} of 32 differ {differ} "
                  f"(alone {alone_seconds:.0f} s, batch {time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a preset (e.g. smollm2-135m) instead of the tiny architectures")
    parser.add_argument("--new-tokens", type=int, default=40, help="tokens per request with --model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model:
        from rift_ada.models import PRESETS, load_model

        model, _ = load_model(PRESETS[args.model].draft, dtype="bfloat16")
        compare(args.model, model, lambda: real_model_requests(args.new_tokens), draft_length=11)
        return
    for architecture in ARCHITECTURES:
        compare(architecture, tiny_model(architecture, seed=9).to(torch.bfloat16), _ragged_requests, draft_length=4)


if __name__ == "__main__":
    main()
