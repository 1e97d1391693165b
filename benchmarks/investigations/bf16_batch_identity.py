"""Does a batch still equal each request alone when the model runs in bfloat16? The 32 ragged requests
of `tests/test_batch.py::test_batches_of_16_and_32_equal_each_request_alone`, on each tiny architecture
cast to bfloat16, at T = 0 and T = 1, batches of 16 and 32; prints the requests whose tokens, accepted
counts or refreshes differ from the request alone.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/bf16_batch_identity.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
from test_batch import _ragged_requests as requests  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

from rift_ada.speculative import speculative_generate_batch  # noqa: E402

ARCHITECTURES = ("llama", "qwen3_5", "nemotron_h", "gpt_oss", "gemma3_text")


def outcome(result) -> tuple:
    return result.tokens, [r.accepted for r in result.rounds], [r.refreshed for r in result.rounds]


def main() -> None:
    torch.set_num_threads(1)
    for architecture in ARCHITECTURES:
        model = tiny_model(architecture, seed=9).to(torch.bfloat16)
        for temperature in (0.0, 1.0):
            alone = [outcome(speculative_generate_batch(model, [r], draft_length=4, temperature=temperature)[0])
                     for r in requests()]  # fmt: skip
            for max_batch in (16, 32):
                batched = speculative_generate_batch(
                    model, requests(), draft_length=4, temperature=temperature, max_batch=max_batch
                )
                differ = [i for i, got in enumerate(batched) if outcome(got) != alone[i]]
                label = f"{architecture} T={temperature:g} batch {max_batch}"
                print(f"{label}: {len(differ)} of 32 differ {differ}", flush=True)


if __name__ == "__main__":
    main()
