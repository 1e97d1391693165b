"""SGLang adapter: RIFT-ada refresh decisions at the standalone-draft worker's verify callback.

Importable without SGLang. The extension points, as read in the sglang 0.5.23 wheel:

- ``sglang/srt/speculative/base_spec_worker.py``: ``BaseSpecWorker.on_verify_complete_cpu(
  num_correct_drafts_per_req: list[int], batch_size: int = 0)``, a no-op hook "called after verify
  finishes and accept counts are on CPU"; ``note_request_finished(*, rid, natural_stop)`` when a
  request finishes.
- ``sglang/srt/managers/scheduler_components/batch_result_processor.py``
  (``_resolve_spec_v2_tokens``): calls it with ``accept_lens - num_non_draft`` per request, in
  ``batch.reqs`` order, and ``batch_size=len(batch.reqs)``.
- ``sglang/srt/speculative/eagle_worker_v2.py``: ``EAGLEWorkerV2.forward_batch_generation(batch,
  on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)``; a decode batch is drafted
  (``self.draft_worker.draft(batch)``) and verified in that call; an extend batch (prefill) is not
  verified. ``sglang/srt/speculative/standalone_worker_v2.py``: ``StandaloneWorkerV2(EAGLEWorkerV2)``,
  the separate-draft-model worker (its ``StandaloneDraftWorker`` has its own KV pool).
- ``sglang/srt/speculative/spec_info.py``: ``SpeculativeAlgorithm.register(name, supports_overlap=...,
  spec_class=...)``, the plugin registry (``spec_registry.CustomSpecAlgo`` duck-types the enum).

The callback carries counts only; the requests are the batch's. :class:`RiftVerifyHook` therefore
takes the batch's request ids when the worker forwards a decode batch (``before_decode``) and
matches the next ``on_verify_complete_cpu`` to them (first in, first out, so an overlap scheduler
with one batch in flight is matched too). It steps `rift_ada.BatchSessions` (AL = correct drafts +
1, output length tracked per request) and keeps the ids whose draft working set must be refreshed;
``before_decode`` hands them to ``refresh`` (a callable the draft side provides) before that
request's next draft. SGLang's draft has no budgeted KV of its own, so the refresh itself — and the
per-step draft entropies (``record_draft_entropies``) — must come from a draft worker that keeps
one; without entropies use a controller that reads none (``acceptance`` / ``acceptance_drop``).

:func:`register` adds a ``RIFT_STANDALONE`` algorithm whose worker is ``StandaloneWorkerV2`` with
these calls wired in (needs sglang; ``--speculative-algorithm RIFT_STANDALONE``). Not run inside
SGLang here (no GPU); tested with a simulated scheduler (tests/test_engine_adapters.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from rift_ada.batch import BatchSessions
from rift_ada.controller import Controller

__all__ = ["RiftVerifyHook", "register"]

ENTROPY_SIGNALS = frozenset({"entropy", "entropy_rise"})


class RiftVerifyHook:
    """Controller sessions of a SGLang batch, keyed by request id (see the module docstring)."""

    def __init__(
        self,
        controller: Controller,
        *,
        refresh: Callable[[list[Hashable]], None] | None = None,
        feeds_entropy: bool = False,
    ) -> None:
        if not feeds_entropy and controller.signals_used & ENTROPY_SIGNALS:
            raise ValueError(
                f"controller {controller.name!r} reads {sorted(controller.signals_used & ENTROPY_SIGNALS)}; "
                "pass feeds_entropy=True with a draft worker that calls record_draft_entropies, or use a "
                "controller calibrated without them (rift-ada calibrate --signals acceptance,acceptance_drop)"
            )
        self.controller = controller
        self.batch = BatchSessions(controller)
        self.refresh = refresh
        self.feeds_entropy = feeds_entropy
        self.n_committed: dict[Hashable, int] = {}
        self.pending_refresh: set[Hashable] = set()
        self.in_flight: deque[list[Hashable]] = deque()
        self._entropies: dict[Hashable, list[float]] = {}
        self.refreshed: list[tuple[Hashable, int]] = []  # (request id, n_committed) of every applied refresh

    def before_decode(self, reqs: Sequence[Any]) -> None:
        """A decode batch is about to be drafted and verified: apply due refreshes, note its requests.

        ``reqs`` are SGLang ``Req`` objects (``rid``, ``output_ids``) in ``batch.reqs`` order."""
        rids = [req.rid for req in reqs]
        for req in reqs:
            if req.rid not in self.n_committed:  # the prefill emitted its first output token(s)
                self.n_committed[req.rid] = len(req.output_ids)
                self.batch.start(req.rid, resume_at=len(req.output_ids) if len(req.output_ids) > 1 else 0)
        due = [rid for rid in rids if rid in self.pending_refresh]
        if due:
            if self.refresh is not None:
                self.refresh(due)
            for rid in due:
                self.pending_refresh.discard(rid)
                self.refreshed.append((rid, self.n_committed[rid]))
        self.in_flight.append(rids)

    def record_draft_entropies(self, rids: Sequence[Hashable], entropies: Sequence[Sequence[float]]) -> None:
        """The draft's per-step entropies of this batch's drafts (a draft worker that computes them)."""
        for rid, values in zip(rids, entropies, strict=True):
            self._entropies[rid] = [float(v) for v in values]

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: Sequence[int], batch_size: int = 0) -> list[Hashable]:
        """SGLang's per-verify callback: one round for each of the oldest in-flight batch's requests;
        returns the ids whose working set is refreshed before their next draft."""
        if not self.in_flight:
            raise RuntimeError("on_verify_complete_cpu without a decode batch in flight (before_decode not called)")
        rids = self.in_flight.popleft()
        if len(num_correct_drafts_per_req) != len(rids) or (batch_size and batch_size != len(rids)):
            raise RuntimeError(
                f"verify of {len(num_correct_drafts_per_req)} requests (batch_size {batch_size}) "
                f"for a decode batch of {len(rids)}"
            )
        live = [i for i, rid in enumerate(rids) if rid in self.n_committed]
        als = [int(num_correct_drafts_per_req[i]) + 1 for i in live]
        for i, al in zip(live, als, strict=True):
            self.n_committed[rids[i]] += al
        entropies = None
        if self.feeds_entropy:
            entropies = [self._entropies.pop(rids[i], [])[:al] for i, al in zip(live, als, strict=True)]
        refresh = self.batch.step(
            [rids[i] for i in live], als, [self.n_committed[rids[i]] for i in live], entropies=entropies
        )
        self.pending_refresh.update(refresh)
        return refresh

    def note_request_finished(self, *, rid: Hashable, natural_stop: bool = True) -> None:
        """Finished, aborted or retracted (KV freed): drop the session; a retracted request that
        comes back starts a new one at its next decode batch (its re-prefill is a refresh)."""
        self.batch.finish(rid)
        self.n_committed.pop(rid, None)
        self.pending_refresh.discard(rid)
        self._entropies.pop(rid, None)


def register(
    name: str = "RIFT_STANDALONE",
    *,
    controller_path: str | None = None,
    refresh: Callable[[Any, list[Hashable]], None] | None = None,
) -> None:
    """Register a SGLang speculative algorithm: the standalone (separate draft model) worker with a
    `RiftVerifyHook` on its verify callback. ``refresh(worker, rids)`` applies a refresh on the draft
    side; ``controller_path`` defaults to ``$RIFT_ADA_CONTROLLER``. Needs sglang."""
    import os

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    controller = Controller.load(controller_path or os.environ["RIFT_ADA_CONTROLLER"])

    class RiftStandaloneWorker(StandaloneWorkerV2):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.rift = RiftVerifyHook(
                controller, refresh=None if refresh is None else (lambda rids: refresh(self, rids))
            )

        def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            if not (batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle()):
                self.rift.before_decode(batch.reqs)
            return super().forward_batch_generation(batch, *args, **kwargs)

        def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
            super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
            self.rift.on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

        def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
            super().note_request_finished(rid=rid, natural_stop=natural_stop)
            self.rift.note_request_finished(rid=rid, natural_stop=natural_stop)

    class RiftStandaloneAlgo(CustomSpecAlgo):  # scheduler branches treat it as STANDALONE
        def is_standalone(self) -> bool:
            return True

    SpeculativeAlgorithm.register(name, supports_overlap=True, spec_class=RiftStandaloneAlgo)(
        lambda server_args: RiftStandaloneWorker
    )
