"""rift-ada's budgeted draft inside transformers' assisted-generation loop, on tiny random models."""

from __future__ import annotations

import pytest
import torch

from rift_ada.budget import make_policy
from rift_ada.controller import Controller, make_controller_dict
from rift_ada.hf_assisted import rift_generate
from rift_ada.hooks import ControllerRefresh
from rift_ada.speculative import speculative_generate
from tests.tiny_models import VOCAB, tiny_model

PROMPT_LENGTH = 48
NEW_TOKENS = 40
POLICY = make_policy("rift-stat", budget=24, obs_window=8)


def _controller() -> Controller:
    """Refreshes when acceptance is low, decided every 4 tokens, so refreshes depend on the rounds."""
    policy = {"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 6.0}]}
    data = make_controller_dict(
        policy,
        name="tiny",
        draft="tiny-draft",
        target="tiny-target",
        temperature=0.0,
        schedule={"decision_stride": 4, "min_age": 8, "max_age": 40},
    )
    return Controller.from_dict(data)


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=0)  # same weights: KV self-speculation, the draft's KV is budgeted
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return draft, target


def _prompt(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, PROMPT_LENGTH), generator=generator)


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_output_and_refresh_rounds_match_rift_loop(models: tuple, seed: int) -> None:
    draft, target = models
    prompt = _prompt(seed)
    greedy = target.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS)
    sequences, drafter = rift_generate(
        target, prompt, draft_model=draft, policy=POLICY, controller=_controller(), max_new_tokens=NEW_TOKENS
    )
    assert torch.equal(sequences, greedy)

    reference = speculative_generate(
        draft,
        prompt[0].tolist(),
        policy=POLICY,
        target_model=target,
        max_new_tokens=NEW_TOKENS,
        draft_length=11,
        refresh_hook=ControllerRefresh(_controller()),
    )
    assert reference.tokens == greedy[0, PROMPT_LENGTH:].tolist()
    ours = [(r.position, r.accepted, r.refreshed) for r in drafter.rounds]
    theirs = [(r.position, r.accepted, r.refreshed) for r in reference.rounds]
    assert ours == theirs
    assert drafter.refreshes == reference.refreshes
    assert 0 < drafter.refreshes < len(drafter.rounds), "the test needs some refreshes and some non-refreshes"
    assert any(r.accepted < 11 for r in drafter.rounds), "the budgeted draft must be rejected sometimes"
    ref_entropies = [e for r in reference.rounds for e in r.committed_entropies]
    assert [e for r in drafter.rounds for e in r.committed_entropies] == pytest.approx(ref_entropies, abs=1e-4)


def test_different_draft_model(models: tuple) -> None:
    """A separate (differently seeded) draft: output still equals the target's greedy decoding."""
    _, target = models
    draft = tiny_model("llama", seed=7)
    draft.generation_config.eos_token_id = None
    prompt = _prompt(3)
    greedy = target.generate(prompt, do_sample=False, max_new_tokens=24)
    sequences, drafter = rift_generate(target, prompt, draft_model=draft, policy=POLICY, max_new_tokens=24)
    assert torch.equal(sequences, greedy)
    assert sum(r.accepted + 1 for r in drafter.rounds) == 24


def test_sampling_runs_and_decisions_replay_through_the_controller(models: tuple) -> None:
    """T > 0: transformers samples the verification, so tokens differ from rift-ada's loop; what holds is
    that every refresh is the one the controller decides on the rounds the loop actually saw."""
    draft, target = models
    torch.manual_seed(0)
    controller = _controller()
    sequences, drafter = rift_generate(
        target,
        _prompt(4),
        draft_model=draft,
        policy=POLICY,
        controller=controller,
        temperature=1.0,
        max_new_tokens=NEW_TOKENS,
    )
    assert sequences.shape == (1, PROMPT_LENGTH + NEW_TOKENS)
    session = controller.new_session()
    n_committed = 0
    replayed = []
    for record in drafter.rounds:
        n_committed += record.accepted + 1
        session.record_round(record.al, record.committed_entropies)
        replayed.append(session.decide(n_committed))
    assert replayed == [r.refreshed for r in drafter.rounds]


def test_mismatched_temperature_is_refused(models: tuple) -> None:
    draft, target = models
    from rift_ada.hf_assisted import RiftCandidateGenerator, rift_assisted_decoding

    drafter = RiftCandidateGenerator(draft, POLICY, temperature=0.5)
    with pytest.raises(ValueError, match="do_sample=False"):
        target.generate(_prompt(5), custom_generate=rift_assisted_decoding, rift_drafter=drafter, max_new_tokens=4)
    assert "_get_candidate_generator" not in vars(target)
