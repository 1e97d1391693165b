"""The TensorRT-LLM and SGLang adapters driven by simulated engines whose calls follow the engines' sources.

TensorRT-LLM (repository as stored by the code-search tool): the executor calls
``Drafter.prepare_draft_tokens(scheduled_requests, resource_manager)`` before each target forward
(``tensorrt_llm/_torch/speculative/drafter.py`` @83ab45a); a request carries ``py_request_id``,
``get_tokens(0)``, ``py_prompt_len``, ``py_num_accepted_draft_tokens``, ``py_draft_tokens``, ``state``
(``model_drafter.py`` @0859050); resource managers get ``prepare_resources`` / ``update_resources`` /
``free_resources(request)`` every iteration (``kv_cache_compression/interface.py`` @6cedd04).

SGLang 0.5.23 (wheel): the worker's ``forward_batch_generation(batch)`` drafts and verifies a decode
batch (``speculative/eagle_worker_v2.py``), then the result processor calls
``on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=len(batch.reqs))`` in ``batch.reqs``
order (``managers/scheduler_components/batch_result_processor.py``) and ``note_request_finished(rid=...,
natural_stop=...)`` when a request finishes (``speculative/base_spec_worker.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from rift_ada.budget import make_policy
from rift_ada.controller import Controller, make_controller_dict
from rift_ada.engine_draft import loop_reference
from rift_ada.sglang_adapter import RiftVerifyHook
from rift_ada.trtllm_adapter import RiftDrafter
from tests.tiny_models import VOCAB, tiny_model

K = 5


def _controller(policy: dict, stride: int = 4) -> Controller:
    data = make_controller_dict(
        policy, name="t", draft="d", target="t", temperature=0.0,
        schedule={"decision_stride": stride, "min_age": 8, "max_age": 32},
    )  # fmt: skip
    return Controller.from_dict(data)


def _greedy_next(model: torch.nn.Module, tokens: list[int]) -> list[int]:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].argmax(-1).tolist()


# -- TensorRT-LLM ---------------------------------------------------------------------------------


@dataclass
class _LlmRequest:
    """The LlmRequest fields a drafter reads and writes."""

    py_request_id: int
    tokens: list[int]
    py_prompt_len: int
    py_max_new_tokens: int
    py_num_accepted_draft_tokens: int = 0
    py_draft_tokens: list[int] = field(default_factory=list)
    state: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(name="GENERATION_IN_PROGRESS"))

    def get_tokens(self, beam: int) -> list[int]:
        assert beam == 0
        return list(self.tokens)


def test_trtllm_drafter_in_a_simulated_executor() -> None:
    target = tiny_model("llama", seed=0)
    controller = _controller({"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 4.0}]})
    policy = make_policy("rift-stat", budget=24, obs_window=8)
    drafter = RiftDrafter(tiny_model("llama", seed=0), controller=controller, policy=policy, max_draft_len=K)
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(3, VOCAB, (40,), generator=generator).tolist()
    prompts = [first, torch.randint(3, VOCAB, (52,), generator=generator).tolist(), list(first)]  # 0 and 2 alike
    limits = [40, 20, 30]
    requests = []
    for rid, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):  # context phase: one token each
        requests.append(_LlmRequest(1000 + rid, [*prompt, _greedy_next(target, prompt)[-1]], len(prompt), limit))
    drafter.resources.prepare_resources(SimpleNamespace(context_requests=requests))
    active = list(requests)
    while active:
        drafter.prepare_draft_tokens(SimpleNamespace(generation_requests=active, context_requests=[]))
        for request in active:  # the target verifies the drafts (greedy)
            drafts = request.py_draft_tokens
            assert len(drafts) == K
            greedy = _greedy_next(target, request.tokens + drafts)[len(request.tokens) - 1 :]
            accepted = 0
            while accepted < K and drafts[accepted] == greedy[accepted]:
                accepted += 1
            remaining = request.py_max_new_tokens - (len(request.tokens) - request.py_prompt_len)
            committed = (drafts[:accepted] + [greedy[accepted]])[:remaining]
            request.tokens += committed
            request.py_num_accepted_draft_tokens = len(committed) - 1
        drafter.resources.update_resources(SimpleNamespace(generation_requests=active, context_requests=[]))
        for request in [r for r in active if len(r.tokens) - r.py_prompt_len >= r.py_max_new_tokens]:
            request.state = SimpleNamespace(name="GENERATION_COMPLETE")
            drafter.resources.free_resources(request)
        active = [r for r in active if r.state.name != "GENERATION_COMPLETE"]

    states = {state.key: state for state in drafter.all_requests()}
    assert sorted(states) == [1000, 1001, 1002]  # keyed by the engine's request ids, identical prompts apart
    assert not drafter.engine.live and len(drafter.engine.finished) == 3  # every finished request dropped
    refreshes = 0
    for request in requests:
        state = states[request.py_request_id]
        expected = request.tokens[: request.py_prompt_len]
        for _ in range(request.py_max_new_tokens):
            expected.append(_greedy_next(target, expected)[-1])
        assert request.tokens == expected  # T = 0: the target's greedy text
        assert state.tokens == expected[: len(state.tokens)]
        (reference,) = loop_reference(
            drafter.engine.draft_model, [expected[: request.py_prompt_len]], [expected[request.py_prompt_len]],
            request.py_max_new_tokens, policy=policy, controller=controller, draft_length=K,
        )  # fmt: skip
        # rift-ada's loop on the same request: the same rounds, but the last, which ends the request
        # before the next prepare_draft_tokens and so never reaches the drafter.
        ours = [(r.accepted, r.refreshed) for r in state.rounds]
        assert ours == [(r.accepted, r.refreshed) for r in reference.rounds[:-1]]
        refreshes += sum(r.refreshed for r in state.rounds)
    assert refreshes > 0 and any(r.accepted > 0 for s in states.values() for r in s.rounds)
    assert [(r.accepted, r.refreshed) for r in states[1002].rounds] == [
        (r.accepted, r.refreshed) for r in states[1000].rounds[: len(states[1002].rounds)]
    ]  # the same prompt decodes alike whatever its id


def test_trtllm_drafter_refuses_a_round_it_did_not_draft() -> None:
    drafter = RiftDrafter(tiny_model("llama", seed=0), policy=make_policy("rift-stat", budget=24, obs_window=8))
    request = _LlmRequest(7, list(range(3, 30)), 26, 10)
    drafter.prepare_draft_tokens(SimpleNamespace(generation_requests=[request]))
    request.tokens += [(request.py_draft_tokens[0] + 1) % VOCAB, 5]  # "accepted" a token never drafted
    request.py_num_accepted_draft_tokens = 1
    with pytest.raises(RuntimeError, match="request 7"):
        drafter.prepare_draft_tokens(SimpleNamespace(generation_requests=[request]))


# -- SGLang ---------------------------------------------------------------------------------------


@dataclass
class _Req:
    rid: str
    output_ids: list[int]


def test_sglang_verify_hook_in_a_simulated_scheduler() -> None:
    """Decisions equal one `Session` per request stepped by hand, with batches in any order, two
    batches in flight (overlap scheduling), a request finishing and one joining mid-run."""
    controller = _controller(
        {"kind": "gate", "any": [{"signal": "acceptance", "op": "<=", "value": 3.5},
                                 {"signal": "acceptance_drop", "op": ">=", "value": 1.0}]},
        stride=8,
    )  # fmt: skip
    refreshed_calls: list[list[str]] = []
    hook = RiftVerifyHook(controller, refresh=refreshed_calls.append)
    rng = random.Random(0)
    reqs = {rid: _Req(rid, [1]) for rid in ("a", "b", "c")}
    sessions = {rid: controller.new_session() for rid in reqs}
    n = {rid: 1 for rid in reqs}
    expected_refreshes: list[tuple[str, int]] = []
    due: set[str] = set()
    in_flight: list[tuple[list[str], list[int]]] = []
    for step in range(120):
        if step == 40:  # "b" finishes, "d" joins
            hook.note_request_finished(rid="b", natural_stop=True)
            del reqs["b"]
            due.discard("b")
            reqs["d"] = _Req("d", [1])
            sessions["d"], n["d"] = controller.new_session(), 1
        order = list(reqs)
        rng.shuffle(order)
        batch = [reqs[rid] for rid in order]
        expected_refreshes += [(rid, n[rid]) for rid in order if rid in due]
        due -= set(order)
        hook.before_decode(batch)
        correct = [rng.choice([0, 1, 2, 5, 7, 10]) for _ in batch]
        in_flight.append((order, correct))
        if len(in_flight) < 2 and step < 119:  # overlap: the verify result arrives one step later
            continue
        done_order, done_correct = in_flight.pop(0)
        refresh = hook.on_verify_complete_cpu(done_correct, batch_size=len(done_order))
        mine = []
        for rid, c in zip(done_order, done_correct, strict=True):
            if rid not in sessions or rid not in reqs:
                continue
            n[rid] += c + 1
            reqs[rid].output_ids += [0] * (c + 1)
            sessions[rid].record_round(c + 1, [])
            if sessions[rid].decide(n[rid]):
                mine.append(rid)
        assert refresh == mine
        due |= set(mine)
    assert hook.refreshed == expected_refreshes and len(expected_refreshes) > 3
    assert [rid for call in refreshed_calls for rid in call] == [rid for rid, _ in expected_refreshes]


def test_sglang_verify_hook_checks_its_inputs() -> None:
    reads_entropy = _controller({"kind": "gate", "any": [{"signal": "entropy", "op": ">=", "value": 2.0}]})
    with pytest.raises(ValueError, match="entropy"):
        RiftVerifyHook(reads_entropy)
    hook = RiftVerifyHook(reads_entropy, feeds_entropy=True)
    with pytest.raises(RuntimeError, match="in flight"):
        hook.on_verify_complete_cpu([1, 2], batch_size=2)
    hook.before_decode([_Req("x", [1]), _Req("y", [1])])
    with pytest.raises(RuntimeError, match="decode batch of 2"):
        hook.on_verify_complete_cpu([1], batch_size=1)
    hook.in_flight.clear()
    by_hand, n = reads_entropy.new_session(), 1  # the committed steps' entropies reach the session
    for step in range(6):
        hook.before_decode([_Req("z", [1])])
        drafted = [2.0 + 0.1 * step + 0.01 * i for i in range(K)]
        hook.record_draft_entropies(["z"], [drafted])
        hook.on_verify_complete_cpu([2], batch_size=1)
        n += 3
        by_hand.record_round(3, drafted[:3])
        by_hand.decide(n)
        assert hook.batch.session("z").last_signals == by_hand.last_signals
    assert by_hand.last_signals["entropy"] == pytest.approx(2.41)  # the decision at n = 16: steps 0..2 of round 4
