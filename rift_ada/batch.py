"""Batched runtime API: one refresh-decision call per engine step for every running request.

Standard library only, like `rift_ada.controller`. Each request keeps its own
`rift_ada.Session` (the one signal definition); `BatchSessions.step` feeds a whole batch's
verification round through those sessions and returns the requests whose draft working set
must be refreshed now. Decisions are identical to stepping the sessions one by one::

    batch = BatchSessions(ControllerSet.load(["qwen-T0.json", "qwen-T1.json"]))
    batch.start("req-1", draft="Qwen/Qwen3.5-4B", target="Qwen/Qwen3.5-122B-A10B", temperature=1.0)
    ...                                                     # every engine step:
    for rid in batch.step(ids, accepted_lens, n_committed, entropies):
        draft_kv.refresh(rid)
    batch.finish("req-1")                                    # request done or aborted

See docs/serving.md for the hook contract (which positions' entropies, preemption, prefix caching).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path

from rift_ada.controller import Controller, Session

__all__ = ["BatchSessions", "ControllerSet"]


class ControllerSet:
    """Controllers keyed by (draft, target, temperature); picks one per request.

    A greedy request (T = 0) only matches a T = 0 controller and a sampled one (T > 0) only a
    T > 0 controller whose temperature is within ``tolerance`` (the nearest wins), because
    acceptance is a different quantity under exact matching and under rejection sampling.
    """

    def __init__(self, controllers: Iterable[Controller], tolerance: float = 0.25) -> None:
        self.controllers: list[Controller] = list(controllers)
        if not self.controllers:
            raise ValueError("ControllerSet: needs at least one controller")
        if not (tolerance >= 0.0 and math.isfinite(tolerance)):
            raise ValueError(f"ControllerSet: tolerance must be a finite number >= 0, got {tolerance!r}")
        self.tolerance = tolerance
        seen: dict[tuple[str, str, float], str] = {}
        for controller in self.controllers:
            key = (controller.draft, controller.target, controller.temperature)
            if key in seen:
                raise ValueError(
                    f"ControllerSet: controllers {seen[key]!r} and {controller.name!r} both serve "
                    f"draft={key[0]!r} target={key[1]!r} temperature={key[2]}"
                )
            seen[key] = controller.name

    @classmethod
    def load(cls, paths: Iterable[str | Path], tolerance: float = 0.25) -> ControllerSet:
        """Load controller files (each validated; `ControllerError` names the file and field)."""
        return cls((Controller.load(path) for path in paths), tolerance)

    def select(self, draft: str, target: str, temperature: float) -> Controller:
        """The controller for a request; raises `LookupError` naming what was asked when none fits."""
        best: Controller | None = None
        best_gap = math.inf
        for controller in self.controllers:
            if controller.draft != draft or controller.target != target:
                continue
            if (controller.temperature == 0.0) != (temperature == 0.0):
                continue
            gap = abs(controller.temperature - temperature)
            if gap <= self.tolerance and gap < best_gap:
                best, best_gap = controller, gap
        if best is None:
            available = ", ".join(f"({c.draft}, {c.target}, T={c.temperature})" for c in self.controllers)
            raise LookupError(
                f"no controller for draft={draft!r} target={target!r} temperature={temperature} "
                f"(tolerance {self.tolerance}); available: {available}"
            )
        return best


class BatchSessions:
    """Sessions keyed by request id, stepped one engine step (one verification round) at a time."""

    __slots__ = ("_controllers", "_offsets", "_sessions")

    def __init__(self, controllers: Controller | ControllerSet) -> None:
        self._controllers = controllers
        self._sessions: dict[Hashable, Session] = {}
        self._offsets: dict[Hashable, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    def start(
        self,
        request_id: Hashable,
        *,
        draft: str | None = None,
        target: str | None = None,
        temperature: float | None = None,
        resume_at: int = 0,
    ) -> Session:
        """Open the session of a request at its (re-)prefill, which counts as a refresh.

        With a `ControllerSet`, ``draft``, ``target`` and ``temperature`` choose the controller.
        ``resume_at`` is the number of output tokens already committed when the draft KV is
        rebuilt by a fresh prefill (preemption by recompute): positions then count from there.
        """
        if request_id in self._sessions:
            raise ValueError(f"request {request_id!r} already has a session (finish it first)")
        if resume_at < 0:
            raise ValueError(f"resume_at must be >= 0, got {resume_at}")
        controller = self._controllers
        if isinstance(controller, ControllerSet):
            if draft is None or target is None or temperature is None:
                raise ValueError("start: a ControllerSet needs draft, target and temperature to choose a controller")
            controller = controller.select(draft, target, temperature)
        session = controller.new_session()
        self._sessions[request_id] = session
        self._offsets[request_id] = resume_at
        return session

    def finish(self, request_id: Hashable) -> Session | None:
        """Drop a request's session (finished, aborted, or preempted with its KV freed); returns it."""
        self._offsets.pop(request_id, None)
        return self._sessions.pop(request_id, None)

    def session(self, request_id: Hashable) -> Session:
        try:
            return self._sessions[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} has no session (call start() at its prefill)") from None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._sessions

    # -- the per-step call ------------------------------------------------------------------------

    def step(
        self,
        request_ids: Sequence[Hashable],
        accepted_lens: Sequence[float],
        n_committed: Sequence[int],
        entropies: Sequence[Iterable[float]] | None = None,
        query_drifts: Sequence[float | None] | None = None,
    ) -> list[Hashable]:
        """Record one verification round for each listed request and decide; returns those to refresh.

        Per request i: ``accepted_lens[i]`` is the round's AL (accepted drafts + 1),
        ``n_committed[i]`` its output tokens committed after the round, ``entropies[i]`` the
        draft entropies of the steps conditioned on committed text (accepted drafts and the first
        rejected one), ``query_drifts[i]`` a drift measured on device at this step (None: not
        measured this step). Requests absent from ``request_ids`` are untouched.
        """
        count = len(request_ids)
        if len(accepted_lens) != count or len(n_committed) != count:
            raise ValueError(
                f"step: request_ids has {count} entries, accepted_lens {len(accepted_lens)}, "
                f"n_committed {len(n_committed)}"
            )
        if entropies is not None and len(entropies) != count:
            raise ValueError(f"step: request_ids has {count} entries, entropies {len(entropies)}")
        if query_drifts is not None and len(query_drifts) != count:
            raise ValueError(f"step: request_ids has {count} entries, query_drifts {len(query_drifts)}")
        sessions = self._sessions
        offsets = self._offsets
        refresh: list[Hashable] = []
        for i, request_id in enumerate(request_ids):
            session = sessions.get(request_id)
            if session is None:
                raise KeyError(f"request {request_id!r} has no session (call start() at its prefill)")
            session.record_round(accepted_lens[i], entropies[i] if entropies is not None else ())
            if query_drifts is not None:
                drift = query_drifts[i]
                if drift is not None:
                    session.record_query_drift(drift)
            if session.decide(n_committed[i] - offsets[request_id]):
                refresh.append(request_id)
        return refresh
