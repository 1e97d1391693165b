"""TensorRT-LLM adapter: a user-provided drafter with a rift-ada budgeted draft, keyed by request ids.

Importable without TensorRT-LLM (the engine classes are looked up only when it is installed). The
extension points, as read in the TensorRT-LLM repository stored by the code-search tool:

- ``tensorrt_llm/_torch/speculative/drafter.py`` (commit 83ab45a): ``Drafter(max_concurrency)``, whose
  abstract ``prepare_draft_tokens(scheduled_requests, resource_manager=None)`` the executor calls
  before each target forward; it sets ``request.py_draft_tokens`` for the generation requests
  (``pad_draft_tokens_for_cuda_graph`` reads ``self.max_draft_len``).
- ``tensorrt_llm/llmapi/llm_args.py``: ``UserProvidedDecodingConfig(max_draft_len=..., drafter=...,
  resource_manager=...)`` plugs a ``Drafter`` instance and an optional ``BaseResourceManager`` in.
- ``tensorrt_llm/_torch/speculative/model_drafter.py`` (commit 0859050), the engine's own two-model
  drafter, for what a request carries: ``py_request_id``, ``get_tokens(0)`` (prompt and committed
  tokens), ``py_prompt_len``, ``py_num_accepted_draft_tokens`` (drafts accepted last step),
  ``py_draft_tokens``, ``state`` (``GENERATION_COMPLETE`` requests are skipped).
- ``tensorrt_llm/_torch/kv_cache_compression/interface.py`` (commit 6cedd04),
  ``BaseKVCacheCompressionManager``: a ``BaseResourceManager`` whose ``prepare_resources`` /
  ``update_resources`` / ``free_resources`` (called by the executor every iteration) fire
  ``on_request_init``, ``on_context_step_end``, ``on_generation_step_end`` and ``on_request_finish``.
  :class:`RiftDraftResources` implements that resource-manager interface with those hook names for
  the *draft's* KV working set: a request's draft state and controller session are dropped at
  ``on_request_finish``.

`RiftDrafter` keeps one `rift_ada.engine_draft.EngineDraft` state per ``py_request_id`` (the draft
runs with transformers beside the engine, outside its paged KV), records each verification round
(AL = accepted + 1, from the tokens the request committed) in `rift_ada.BatchSessions`, refreshes the
working set when the controller says so and drafts K tokens greedily (T = 0 entropies)::

    from tensorrt_llm import LLM
    drafter = RiftDrafter(draft_model, controller=Controller.load("controller.json"), max_draft_len=11)
    llm = LLM(model=TARGET, speculative_config=drafter.decoding_config(), disable_overlap_scheduler=True)

Not run inside TensorRT-LLM here (no GPU, no wheel); tested with a simulated executor
(tests/test_engine_adapters.py) whose calls follow the sources above.
"""

from __future__ import annotations

from typing import Any

import torch

from rift_ada.budget import CachePolicy
from rift_ada.controller import Controller
from rift_ada.engine_draft import DraftRequest, EngineDraft, draft_policy

__all__ = ["RiftDraftResources", "RiftDrafter"]

GENERATION_COMPLETE = "GENERATION_COMPLETE"  # LlmRequestState member name


def _drafter_base() -> type:
    """TensorRT-LLM's ``Drafter`` when it is installed, else a stand-in with its constructor."""
    try:
        from tensorrt_llm._torch.speculative.drafter import Drafter
    except ImportError:

        class Drafter:  # type: ignore[no-redef]
            def __init__(self, max_concurrency: int | None = None) -> None:
                self.max_concurrency = max_concurrency

    return Drafter


def _is_complete(request: Any) -> bool:
    state = getattr(request, "state", None)
    return getattr(state, "name", state) == GENERATION_COMPLETE


class RiftDrafter(_drafter_base()):  # type: ignore[misc]
    """A TensorRT-LLM ``Drafter`` drafting with a rift-ada budgeted draft (see the module docstring)."""

    def __init__(
        self,
        draft_model: torch.nn.Module,
        *,
        controller: Controller | None = None,
        policy: CachePolicy | None = None,
        max_draft_len: int = 11,
        max_concurrency: int | None = None,
        rounds_log: str | None = None,
    ) -> None:
        super().__init__(max_concurrency)
        self.max_draft_len = int(max_draft_len)
        self.engine = EngineDraft(
            draft_model, policy or draft_policy(controller), controller, self.max_draft_len, rounds_log=rounds_log
        )
        self.resources = RiftDraftResources(self)

    @torch.no_grad()
    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        """Record each generation request's last round, step the controller, set ``py_draft_tokens``."""
        live: list[tuple[Any, DraftRequest]] = []
        verified: list[DraftRequest] = []
        for request in scheduled_requests.generation_requests:
            if _is_complete(request):
                continue
            key = int(request.py_request_id)
            tokens = [int(t) for t in request.get_tokens(0)]
            state = self.engine.live.get(key)
            if state is None:  # first draft of this request: the context phase emitted one token
                state = self.engine.start(key, tokens, int(request.py_prompt_len))
            else:
                committed = tokens[len(state.tokens) :]
                if len(committed) != int(request.py_num_accepted_draft_tokens) + 1:
                    raise RuntimeError(
                        f"request {key}: {len(committed)} tokens committed but py_num_accepted_draft_tokens = "
                        f"{request.py_num_accepted_draft_tokens}"
                    )
                self.engine.commit(state, committed)
                verified.append(state)
            live.append((request, state))
        self.engine.step(verified)
        for request, state in live:
            request.py_draft_tokens = self.engine.draft(state)

    def decoding_config(self) -> Any:
        """TensorRT-LLM's ``UserProvidedDecodingConfig`` for this drafter (needs tensorrt_llm)."""
        from tensorrt_llm.llmapi import UserProvidedDecodingConfig

        return UserProvidedDecodingConfig(
            max_draft_len=self.max_draft_len, drafter=self, resource_manager=self.resources
        )

    def all_requests(self) -> list[DraftRequest]:
        """Every request state, dropped and live (for checks and tests)."""
        return self.engine.all_requests()


class RiftDraftResources:
    """The drafter's resource manager (``UserProvidedDecodingConfig.resource_manager``): the
    ``BaseResourceManager`` interface the executor calls each iteration, translated into the
    KV-compression lifecycle hooks of ``BaseKVCacheCompressionManager`` for the draft's working set."""

    def __init__(self, drafter: RiftDrafter) -> None:
        self.drafter = drafter

    # BaseResourceManager interface (called by the executor)
    def get_max_resource_count(self) -> int:
        return 0  # the draft's KV lives outside the engine's pools: nothing for the scheduler to gate on

    def get_needed_resource_to_completion(self, request: Any) -> int:
        return 0

    def prepare_resources(self, scheduled_batch: Any) -> None:
        for request in scheduled_batch.context_requests:
            if getattr(request, "is_first_context_chunk", True):
                self.on_request_init(request)

    def update_resources(self, scheduled_batch: Any, attn_metadata: Any = None, kv_cache_dtype_byte_size: Any = None):
        self.on_generation_step_end(scheduled_batch, attn_metadata)

    def free_resources(self, request: Any) -> None:
        self.on_request_finish(request)

    # KV-compression lifecycle hooks (BaseKVCacheCompressionManager names)
    def on_request_init(self, request: Any, **kwargs: Any) -> None:
        """A (re-)admitted request: a state left from before (recompute preemption) is dropped, so
        the draft prefills it afresh at its next draft step."""
        self.drafter.engine.finish(int(request.py_request_id))

    def on_generation_step_end(self, scheduled_batch: Any, attn_metadata: Any = None, **kwargs: Any) -> None:
        """Refresh decisions are applied in ``prepare_draft_tokens``, before the next draft steps."""

    def on_request_finish(self, request: Any, **kwargs: Any) -> None:
        """Finished or aborted: drop the request's draft state and controller session."""
        self.drafter.engine.finish(int(request.py_request_id))
