"""SmolLM2-135M in bfloat16: a batch of ragged requests gives each request what it gives alone, bit for bit.

Its shapes are the ones where a padded batch differs from a row alone in bfloat16: products of more than 32
rows (a verification of 8 requests x 12 tokens is 96 rows) and attention over padded keys
(benchmarks/investigations/batch_invariance.py). A free-running T = 1 run samples from every distribution,
so one last-bit difference in a logit shows up as another token."""

from __future__ import annotations

import pytest
import torch

from rift_ada.budget import make_policy
from rift_ada.models import PRESETS, load_model
from rift_ada.packed_linear import bfloat16_rows_exact
from rift_ada.speculative import BatchRequest, speculative_generate_batch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not bfloat16_rows_exact(), reason="this CPU's packed bf16 rows are not exact"),
]


def _requests() -> list[BatchRequest]:
    """8 ragged prompts (30-135 tokens), four policies (a refresh every 16 tokens among them), 26-32 tokens each:
    rows end at different rounds, so the last verifications are ragged too."""
    policies = [make_policy("rift-stat", budget=48, obs_window=16), make_policy("snapkv", budget=40, obs_window=16),
                make_policy("rift-dyn", budget=48, obs_window=16, refresh_interval=16),
                make_policy("full")]  # fmt: skip
    made = []
    for index in range(8):
        prompt = torch.randint(100, 40000, (30 + 15 * index,), generator=torch.Generator().manual_seed(index))
        made.append(BatchRequest(prompt.tolist(), policies[index % 4], max_new_tokens=26 + index % 7, seed=index))
    return made


def _outcome(result) -> tuple:
    return result.tokens, [r.accepted for r in result.rounds], [r.refreshed for r in result.rounds]


def test_a_bfloat16_smollm2_batch_equals_each_request_alone():
    model, _ = load_model(PRESETS["smollm2-135m"].draft, dtype="bfloat16")
    alone = [_outcome(speculative_generate_batch(model, [r], temperature=1.0)[0]) for r in _requests()]
    batched = speculative_generate_batch(model, _requests(), temperature=1.0, max_batch=8)
    assert [_outcome(result) for result in batched] == alone
    assert any(refreshed for _, _, refreshes in alone for refreshed in refreshes)
