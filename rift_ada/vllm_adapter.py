"""vLLM adapter: a ``custom_class`` proposer drafting with a rift-ada budgeted draft.

Optional (never imported by the core; vLLM in its own venv, `make vllm-check`). vLLM 0.32 calls
``propose`` after every verification step with, per batch row, the tokens the row committed this
step; this proposer keeps one `rift_ada.cache.BudgetedCache` per request (the draft runs in the
worker process with transformers, on vLLM's device and dtype, outside vLLM's paged KV), records each
round in `rift_ada.BatchSessions` and refreshes a request's working set when its controller says so::

    RIFT_ADA_CONTROLLER=controller.json \
    python -c "from vllm import LLM; LLM(model=TARGET, speculative_config={
        'method': 'custom_class', 'model': 'rift_ada.vllm_adapter.RiftDraftProposer',
        'num_speculative_tokens': 11})"

Settings (environment, read at construction): ``RIFT_ADA_DRAFT`` (HF directory of the draft;
default: the target's, i.e. KV self-speculation), ``RIFT_ADA_POLICY`` (default ``rift-stat``),
``RIFT_ADA_CONTROLLER`` (a controller JSON; its ``cache`` sets the draft's budget, window share,
observation window and block size; without one the working set is never refreshed),
``RIFT_ADA_BUDGET`` (overrides the budget; default 512 without a controller), ``RIFT_ADA_ROUNDS_LOG``
(append one JSON line per round: request, prompt key, position, accepted, refreshed, committed
entropies — read by tools/check_vllm_adapter.py).

Limits (docs/serving.md): vLLM gives a custom proposer no request ids, so a row is matched to its
request by its committed tokens; the draft drafts greedily and entropies are those of T = 0 (use a
T = 0 controller); a request missing from a step (finished, preempted) loses its state and is
re-prefilled by the draft when it comes back (a refresh, as for recompute preemption).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rift_ada.budget import CachePolicy
from rift_ada.controller import Controller
from rift_ada.engine_draft import DraftRequest, EngineDraft, draft_policy, loop_reference, prompt_key

__all__ = ["RiftDraftProposer", "draft_policy", "engine_placement", "loop_reference", "prompt_key"]


def engine_placement(vllm_config: Any) -> tuple[torch.device, torch.dtype]:
    """The device and dtype vLLM runs the target on (``device_config.device``, ``model_config.dtype``),
    so the draft runs beside it: a CPU engine drafts on the CPU, a GPU engine on its GPU."""
    config = getattr(vllm_config, "device_config", None)
    device = getattr(config, "device", None) or "cpu"
    if device == "auto":  # resolved by vLLM into device_type
        device = getattr(config, "device_type", None) or "cpu"
    dtype = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    return torch.device(device), dtype if isinstance(dtype, torch.dtype) else torch.float32


class RiftDraftProposer:
    """vLLM ``custom_class`` proposer (see the module docstring)."""

    def __init__(
        self, vllm_config: Any, draft_model: torch.nn.Module | None = None, policy: CachePolicy | None = None
    ) -> None:
        """vLLM passes only ``vllm_config``; ``draft_model`` and ``policy`` (tests) replace the settings."""
        spec = vllm_config.speculative_config
        controller_path = os.environ.get("RIFT_ADA_CONTROLLER")
        controller = Controller.load(controller_path) if controller_path else None
        if draft_model is None:
            from transformers import AutoModelForCausalLM

            path = os.environ.get("RIFT_ADA_DRAFT") or vllm_config.model_config.model
            device, dtype = engine_placement(vllm_config)
            draft_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.engine = EngineDraft(
            draft_model,
            policy or draft_policy(controller),
            controller,
            int(spec.num_speculative_tokens),
            rounds_log=os.environ.get("RIFT_ADA_ROUNDS_LOG"),
        )
        self._by_tokens: dict[tuple[int, ...], list[int]] = {}  # committed tokens -> live keys
        self._next_id = 0

    @property
    def draft(self) -> torch.nn.Module:
        return self.engine.draft_model

    @property
    def policy(self) -> CachePolicy:
        return self.engine.policy

    @property
    def controller(self) -> Controller | None:
        return self.engine.controller

    @property
    def finished(self) -> list[DraftRequest]:
        """States dropped (the request finished or left the batch)."""
        return self.engine.finished

    # -- vLLM entry points ------------------------------------------------------------------------

    def load_model(self, target_model: Any) -> None:
        """Called by vLLM's CPU model runner for every drafter; the draft was loaded in __init__."""

    @torch.no_grad()
    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any, **kwargs: Any
    ) -> list[list[int]]:
        """Draft tokens per batch row, after recording each row's verification round.

        vLLM 0.32 (``GPUModelRunner.propose_draft_token_ids``, method ``custom_class``) calls this
        after the step's bookkeeping: ``sampled_token_ids[i]`` are the tokens row i committed this
        step (accepted drafts + the target's token; empty for a prefill chunk) and
        ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` its prompt and every committed token."""
        by_tokens: dict[tuple[int, ...], list[int]] = {}
        verified: list[DraftRequest] = []
        rows: list[DraftRequest | None] = [None] * len(sampled_token_ids)
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk that produced no token yet
                continue
            tokens = [int(t) for t in token_ids_cpu[row, : int(num_tokens_no_spec[row])]]
            keys = self._by_tokens.get(tuple(tokens[: len(tokens) - len(sampled)]))
            if keys:
                state = self.engine.live[keys.pop()]
                self.engine.commit(state, [int(t) for t in sampled])
                verified.append(state)
            else:  # first sight: the prefill emitted the first output token
                state = self.engine.start(self._next_id, tokens, len(tokens) - len(sampled))
                self._next_id += 1
            by_tokens.setdefault(tuple(state.tokens), []).append(state.key)
            rows[row] = state
        self.engine.step(verified)
        for keys in self._by_tokens.values():  # rows gone from the batch: finished or preempted
            for key in keys:
                self.engine.finish(key)
        self._by_tokens = by_tokens
        return [[] if state is None else self.engine.draft(state) for state in rows]

    # -- introspection ----------------------------------------------------------------------------

    def all_requests(self) -> list[DraftRequest]:
        """Every request state, live and dropped (for checks and tests)."""
        return self.engine.all_requests()
