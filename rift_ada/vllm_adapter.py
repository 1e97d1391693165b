"""Prototype vLLM adapter: a ``custom_class`` proposer drafting with a rift-ada budgeted draft.

Optional (extra ``vllm``; never imported by the core). vLLM 0.32 calls ``propose`` after every
verification step with, per batch row, the tokens the row committed this step; this proposer
keeps one `rift_ada.cache.BudgetedCache` per request (the draft runs in-process with
transformers, outside vLLM's paged KV), records each round in `rift_ada.BatchSessions` and
refreshes a request's working set when its controller says so::

    RIFT_ADA_CONTROLLER=controller.json RIFT_ADA_BUDGET=512 \\
    python -c "from vllm import LLM; LLM(model=TARGET, speculative_config={
        'method': 'custom_class', 'model': 'rift_ada.vllm_adapter.RiftDraftProposer',
        'num_speculative_tokens': 11})"

Settings (environment, read at construction): ``RIFT_ADA_DRAFT`` (HF directory of the draft;
default: the target's, i.e. KV self-speculation), ``RIFT_ADA_POLICY`` (default ``rift-stat``),
``RIFT_ADA_BUDGET`` (default 512), ``RIFT_ADA_CONTROLLER`` (a controller JSON; without one the
working set is never refreshed), ``RIFT_ADA_ROUNDS_LOG`` (append one JSON line per round: request,
position, accepted, refreshed, committed entropies — for checks such as tools/check_vllm_adapter.py).

Limits of the prototype (docs/serving.md): vLLM gives a custom proposer no request ids, so a row
is matched to its request by its committed tokens; the draft drafts greedily and entropies are
those of T = 0 (use a T = 0 controller); a request missing from a step (finished, preempted) loses
its state and is re-prefilled by the draft when it comes back (a refresh, as for recompute).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from rift_ada.batch import BatchSessions
from rift_ada.budget import CachePolicy, make_policy
from rift_ada.cache import BudgetedCache, make_draft_cache
from rift_ada.controller import Controller
from rift_ada.hooks import ControllerRefresh
from rift_ada.speculative import (
    BatchRequest,
    RoundRecord,
    SpeculativeResult,
    forward_tokens,
    speculative_generate_batch,
    token_entropy,
)

__all__ = ["RiftDraftProposer", "engine_placement", "loop_reference"]


def engine_placement(vllm_config: Any) -> tuple[torch.device, torch.dtype]:
    """The device and dtype vLLM runs the target on (``device_config.device``, ``model_config.dtype``),
    so the draft runs beside it: a CPU engine drafts on the CPU, a GPU engine on its GPU."""
    config = getattr(vllm_config, "device_config", None)
    device = getattr(config, "device", None) or "cpu"
    if device == "auto":  # resolved by vLLM into device_type
        device = getattr(config, "device_type", None) or "cpu"
    dtype = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    return torch.device(device), dtype if isinstance(dtype, torch.dtype) else torch.float32


@dataclass
class _Request:
    """Draft-side state of one request."""

    rid: int
    cache: BudgetedCache
    tokens: list[int]  # prompt + committed output tokens
    prompt_length: int
    cache_length: int  # tokens written to the draft cache (all but the pending last one)
    snapshot: Any = None
    drafted: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)


class RiftDraftProposer:
    """vLLM ``custom_class`` proposer (see the module docstring)."""

    def __init__(
        self, vllm_config: Any, draft_model: torch.nn.Module | None = None, policy: CachePolicy | None = None
    ) -> None:
        """vLLM passes only ``vllm_config``; ``draft_model`` and ``policy`` (tests) replace the settings."""
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.policy = policy or make_policy(
            os.environ.get("RIFT_ADA_POLICY", "rift-stat"), int(os.environ.get("RIFT_ADA_BUDGET", "512"))
        )
        if draft_model is None:
            from transformers import AutoModelForCausalLM

            path = os.environ.get("RIFT_ADA_DRAFT") or vllm_config.model_config.model
            device, dtype = engine_placement(vllm_config)
            draft_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.draft = draft_model
        controller_path = os.environ.get("RIFT_ADA_CONTROLLER")
        self.controller = Controller.load(controller_path) if controller_path else None
        self.batch = BatchSessions(self.controller) if self.controller is not None else None
        self._states: dict[tuple[int, ...], list[_Request]] = {}
        self._next_id = 0
        self.finished: list[_Request] = []  # states dropped (request finished or left the batch)
        self.rounds_log = os.environ.get("RIFT_ADA_ROUNDS_LOG")

    # -- vLLM entry points ------------------------------------------------------------------------

    def load_model(self, target_model: Any) -> None:
        """Called by vLLM's CPU model runner for every drafter; the draft was loaded in __init__."""

    @torch.no_grad()
    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any, **kwargs: Any
    ) -> list[list[int]]:
        """Draft tokens per batch row, after recording each row's verification round."""
        seen: dict[tuple[int, ...], list[_Request]] = {}
        rounds: list[tuple[_Request, int]] = []
        row_states: list[_Request | None] = [None] * len(sampled_token_ids)
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk that produced no token yet
                continue
            tokens = [int(t) for t in token_ids_cpu[row, : int(num_tokens_no_spec[row])]]
            state = self._pop_state(tokens[: len(tokens) - len(sampled)])
            if state is None:
                state = self._start(tokens)
            else:
                self._commit(state, [int(t) for t in sampled])
                rounds.append((state, len(sampled) - 1))
            seen.setdefault(tuple(state.tokens), []).append(state)
            row_states[row] = state
        self._step_controller(rounds)
        self._log_rounds(rounds)
        for states in self._states.values():  # rows gone from the batch: finished or preempted
            for state in states:
                if self.batch is not None:
                    self.batch.finish(state.rid)
                self.finished.append(state)
        self._states = seen
        return [[] if state is None else self._draft(state) for state in row_states]

    # -- per-request steps ------------------------------------------------------------------------

    def _pop_state(self, committed_before: list[int]) -> _Request | None:
        states = self._states.get(tuple(committed_before))
        if not states:
            return None
        state = states.pop()
        if not states:
            del self._states[tuple(committed_before)]
        return state

    def _start(self, tokens: list[int]) -> _Request:
        """A request the draft has not seen: prefill all committed tokens but the last."""
        cache = make_draft_cache(self.draft, self.policy)
        forward_tokens(self.draft, tokens[:-1], cache, 0)
        cache.query_summary()  # query summaries cover the output only
        state = _Request(self._next_id, cache, list(tokens), len(tokens) - 1, len(tokens) - 1)
        self._next_id += 1
        if self.batch is not None:
            self.batch.start(state.rid)
        return state

    def _commit(self, state: _Request, sampled: list[int]) -> None:
        """Roll the draft cache back to the round's start and feed the committed tokens."""
        accepted = len(sampled) - 1
        if state.drafted[:accepted] != sampled[:accepted]:
            raise RuntimeError("vLLM accepted tokens that this proposer did not draft (row matched wrongly)")
        pending = state.tokens[state.cache_length :]
        kept = pending + sampled[:accepted]
        state.cache.restore(state.snapshot)
        forward_tokens(self.draft, kept, state.cache, state.cache_length)
        state.cache_length += len(kept)
        position = len(state.tokens) - state.prompt_length
        state.rounds.append(RoundRecord(len(state.rounds), position, accepted, state.entropies))
        state.tokens.extend(sampled)
        state.snapshot, state.drafted = None, []

    def _step_controller(self, rounds: list[tuple[_Request, int]]) -> None:
        if self.batch is None or not rounds:
            return
        for state, _ in rounds:  # query summaries only at decision rounds, as ControllerRefresh
            stride = self.controller.decision_stride
            n = len(state.tokens) - state.prompt_length
            previous = n - (state.rounds[-1].accepted + 1)
            if n // stride > previous // stride:
                summary = state.cache.query_summary()
                if summary is not None:
                    self.batch.session(state.rid).record_queries(summary)
        refresh = set(
            self.batch.step(
                [state.rid for state, _ in rounds],
                [accepted + 1 for _, accepted in rounds],
                [len(state.tokens) - state.prompt_length for state, _ in rounds],
                [state.rounds[-1].committed_entropies for state, _ in rounds],
            )
        )
        for state, _ in rounds:
            if state.rid in refresh:
                state.cache.refresh()
                state.rounds[-1].refreshed = True

    def _log_rounds(self, rounds: list[tuple[_Request, int]]) -> None:
        if not self.rounds_log or not rounds:
            return
        with open(self.rounds_log, "a", encoding="utf-8") as handle:
            for state, _ in rounds:
                record = state.rounds[-1]
                row = {
                    "request": state.rid,
                    "prompt_length": state.prompt_length,
                    "position": record.position,
                    "accepted": record.accepted,
                    "refreshed": record.refreshed,
                    "entropies": record.committed_entropies,
                }
                handle.write(json.dumps(row) + "\n")

    def _draft(self, state: _Request) -> list[int]:
        """Greedy draft of K tokens from the committed text; the cache is snapshotted first."""
        state.snapshot = state.cache.snapshot()
        feed, position = state.tokens[state.cache_length :], state.cache_length
        drafted, entropies = [], []
        for _ in range(self.k):
            logits = forward_tokens(self.draft, feed, state.cache, position)[-1]
            position += len(feed)
            entropies.append(float(token_entropy(logits, 0.0)))
            token = int(logits.argmax())
            drafted.append(token)
            feed = [token]
        state.drafted, state.entropies = drafted, entropies
        return drafted

    # -- introspection ----------------------------------------------------------------------------

    def all_requests(self) -> list[_Request]:
        """Every request state, live and dropped (for checks and tests)."""
        live = [state for states in self._states.values() for state in states]
        return self.finished + live


class _AfterFirstToken(ControllerRefresh):
    """A controller hook for rift-ada's loop started after the engine's prefill token, which counts
    committed tokens as the proposer does (the prefill's token included)."""

    def __call__(self, record: RoundRecord, n_committed: int, cache: BudgetedCache) -> bool:
        return super().__call__(record, n_committed + 1, cache)


def loop_reference(
    draft_model: torch.nn.Module,
    prompts: list[list[int]],
    first_tokens: list[int],
    max_tokens: int,
    *,
    policy: CachePolicy,
    controller: Controller | None,
    draft_length: int,
) -> list[SpeculativeResult]:
    """rift-ada's own loop (KV self-speculation, T = 0) on the requests an engine ran through the proposer.

    The engine's prefill emits the first output token without drafting, so each request starts from
    its prompt plus that token, with ``max_tokens - 1`` to go and the controller counting that token:
    the draft cache then starts where the proposer's does, and rounds, accepted lengths and refreshes
    compare one to one with the proposer's (`RiftDraftProposer.all_requests`)."""
    requests = [
        BatchRequest(
            [*prompt, int(first)],
            policy,
            max_new_tokens=max_tokens - 1,
            refresh_hook=None if controller is None else _AfterFirstToken(controller),
        )
        for prompt, first in zip(prompts, first_tokens, strict=True)
    ]
    return speculative_generate_batch(draft_model, requests, draft_length=draft_length)
