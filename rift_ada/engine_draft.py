"""The engine-side budgeted draft shared by the engine adapters (vLLM, TensorRT-LLM).

An engine verifies; this drafts. Per request it keeps a `rift_ada.cache.BudgetedCache` (the draft
model runs with transformers beside the engine, on its device), after each verification rolls the
draft cache back to the round's start and feeds the committed tokens (as rift-ada's own loop does),
records the round in `rift_ada.BatchSessions` and refreshes the working set when the request's
controller says so, then drafts the next K tokens greedily. Keys are whatever identifies a request
to the engine (TensorRT-LLM: ``py_request_id``; vLLM: an id given at the first sight of a row).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Hashable, Sequence
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
    greedy_tokens,
    speculative_generate_batch,
    token_entropy,
)

__all__ = ["DraftRequest", "EngineDraft", "draft_policy", "loop_reference", "prompt_key"]


def prompt_key(prompt: Sequence[int]) -> str:
    """A request's prompt as a short key (rounds logs name requests by it)."""
    return hashlib.sha1(json.dumps([int(t) for t in prompt]).encode()).hexdigest()[:16]


def draft_policy(controller: Controller | None) -> CachePolicy:
    """The draft cache: ``RIFT_ADA_POLICY`` (default rift-stat) with the controller's cache settings
    (budget, window share, observation window, block size), ``RIFT_ADA_BUDGET`` overriding its budget
    (default 512 without a controller)."""
    cache = controller.to_dict()["cache"] if controller is not None else {}
    fields = {key: cache[key] for key in ("sw_ratio", "obs_window", "block_size") if key in cache}
    budget = int(os.environ.get("RIFT_ADA_BUDGET") or cache.get("budget", 512))
    return make_policy(os.environ.get("RIFT_ADA_POLICY", "rift-stat"), budget, **fields)


@dataclass
class DraftRequest:
    """Draft-side state of one request."""

    key: Hashable
    cache: BudgetedCache
    tokens: list[int]  # prompt + committed output tokens
    prompt_length: int
    cache_length: int  # tokens written to the draft cache (all but the pending last one)
    snapshot: Any = None
    drafted: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def n_committed(self) -> int:
        """Output tokens committed so far (the engine's prefill token included)."""
        return len(self.tokens) - self.prompt_length


class EngineDraft:
    """Budgeted drafts of an engine's requests (see the module docstring).

    ``start`` when the engine first asks a request for drafts (its prompt and the token its prefill
    emitted), ``commit`` after each verification with the tokens the round committed, ``step``
    once per engine step over the requests that verified, ``draft`` for the next K tokens,
    ``finish`` when the request leaves. ``rounds_log``: append one JSON line per round."""

    def __init__(
        self,
        draft_model: torch.nn.Module,
        policy: CachePolicy,
        controller: Controller | None,
        draft_length: int,
        rounds_log: str | None = None,
    ) -> None:
        self.draft_model = draft_model
        self.policy = policy
        self.controller = controller
        self.k = int(draft_length)
        self.batch = BatchSessions(controller) if controller is not None else None
        self.rounds_log = rounds_log
        self.live: dict[Hashable, DraftRequest] = {}
        self.finished: list[DraftRequest] = []

    def start(self, key: Hashable, tokens: Sequence[int], prompt_length: int) -> DraftRequest:
        """A request the draft has not seen: prefill every token but the last (pending) one."""
        if key in self.live:
            raise ValueError(f"request {key!r} already has a draft state")
        tokens = [int(t) for t in tokens]
        cache = make_draft_cache(self.draft_model, self.policy)
        forward_tokens(self.draft_model, tokens[:-1], cache, 0, logits=False)
        cache.query_summary()  # query summaries cover the output only
        state = DraftRequest(key, cache, tokens, int(prompt_length), len(tokens) - 1)
        self.live[key] = state
        if self.batch is not None:  # a request coming back after recompute preemption resumes its strides
            self.batch.start(key, resume_at=state.n_committed if state.n_committed > 1 else 0)
        return state

    def commit(self, state: DraftRequest, committed: Sequence[int]) -> None:
        """Roll the draft cache back to the round's start and feed the round's committed tokens
        (accepted drafts + the engine's token; fewer where a length limit cut the round)."""
        committed = [int(t) for t in committed]
        accepted = len(committed) - 1
        if state.drafted[:accepted] != committed[:accepted]:
            raise RuntimeError(f"request {state.key!r}: the engine accepted tokens this draft did not propose")
        kept = state.tokens[state.cache_length :] + committed[:accepted]
        state.cache.restore(state.snapshot)
        forward_tokens(self.draft_model, kept, state.cache, state.cache_length, logits=False)
        state.cache_length += len(kept)
        position = state.n_committed
        state.rounds.append(RoundRecord(len(state.rounds), position, accepted, state.entropies))
        state.tokens.extend(committed)
        state.snapshot, state.drafted = None, []

    def step(self, states: Sequence[DraftRequest]) -> list[Hashable]:
        """The controller step over the requests that verified: record their rounds, refresh the
        working sets it decides; returns the refreshed keys (in order)."""
        if self.batch is None or self.controller is None or not states:
            self._log(states)
            return []
        stride = self.controller.decision_stride
        for state in states:  # query summaries only at decision rounds, as ControllerRefresh
            previous = state.n_committed - state.rounds[-1].al
            if state.n_committed // stride > previous // stride:
                summary = state.cache.query_summary()
                if summary is not None:
                    self.batch.session(state.key).record_queries(summary)
        refresh = self.batch.step(
            [state.key for state in states],
            [state.rounds[-1].al for state in states],
            [state.n_committed for state in states],
            [state.rounds[-1].committed_entropies for state in states],
        )
        chosen = set(refresh)
        for state in states:
            if state.key in chosen:
                state.cache.refresh()
                state.rounds[-1].refreshed = True
        self._log(states)
        return list(refresh)

    @torch.no_grad()
    def draft(self, state: DraftRequest, steps: int | None = None) -> list[int]:
        """Greedy draft of ``steps`` (default K) tokens from the committed text; snapshots the cache first."""
        state.snapshot = state.cache.snapshot()
        feed, position = state.tokens[state.cache_length :], state.cache_length
        drafted, entropies = [], []
        for _ in range(self.k if steps is None else steps):
            logits = forward_tokens(self.draft_model, feed, state.cache, position)[-1]
            position += len(feed)
            entropies.append(float(token_entropy(logits, 0.0)))
            token = int(greedy_tokens(logits))
            drafted.append(token)
            feed = [token]
        state.drafted, state.entropies = drafted, entropies
        return drafted

    def finish(self, key: Hashable) -> None:
        """The request left (finished, aborted, preempted by recompute): drop its state and session."""
        state = self.live.pop(key, None)
        if state is None:
            return
        if self.batch is not None:
            self.batch.finish(key)
        self.finished.append(state)

    def all_requests(self) -> list[DraftRequest]:
        """Every request state, dropped and live (for checks and tests)."""
        return self.finished + list(self.live.values())

    def _log(self, states: Sequence[DraftRequest]) -> None:
        if not self.rounds_log or not states:
            return
        with open(self.rounds_log, "a", encoding="utf-8") as handle:
            for state in states:
                record = state.rounds[-1]
                row = {
                    "request": str(state.key),
                    "prompt_sha1": prompt_key(state.tokens[: state.prompt_length]),
                    "prompt_length": state.prompt_length,
                    "position": record.position,
                    "accepted": record.accepted,
                    "refreshed": record.refreshed,
                    "entropies": record.committed_entropies,
                }
                handle.write(json.dumps(row) + "\n")


class _AfterFirstToken(ControllerRefresh):
    """A controller hook for rift-ada's loop started after the engine's prefill token, which counts
    committed tokens as the adapters do (the prefill's token included)."""

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
    """rift-ada's own loop (KV self-speculation, T = 0) on the requests an engine ran through an adapter.

    The engine's prefill emits the first output token without drafting, so each request starts from
    its prompt plus that token, with ``max_tokens - 1`` to go and the controller counting that token:
    the draft cache then starts where the adapter's does, and rounds, accepted lengths and refreshes
    compare one to one with the adapter's (`EngineDraft.all_requests`)."""
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
