"""Refresh hooks that plug a `rift_ada.Controller` into the draft/verify loop."""

from __future__ import annotations

from typing import Any

from rift_ada.cache import BudgetedCache
from rift_ada.controller import Controller
from rift_ada.speculative import RoundRecord


class ControllerRefresh:
    """Drives one controller session from the loop: rounds, query summaries, decisions.

    Query summaries are taken from the draft cache at each decision stride (the mean pre-RoPE
    query per KV group since the previous one). With ``record_strides`` every decision is kept
    as a row (signals, age, refresh, and the cache's retained attention mass) for closed-loop traces.
    """

    def __init__(self, controller: Controller, *, record_strides: bool = False):
        self.controller = controller
        self.session = controller.new_session()
        self.stride = controller.decision_stride
        self.record_strides = record_strides
        self.strides: list[dict[str, Any]] = []
        self._previous = 0

    def __call__(self, record: RoundRecord, n_committed: int, cache: BudgetedCache) -> bool:
        self.session.record_round(record.al, record.committed_entropies)
        decision = n_committed // self.stride > self._previous // self.stride
        self._previous = n_committed
        if not decision:
            return False
        summary = cache.query_summary()
        if summary is not None:
            self.session.record_queries(summary)
        age_before = n_committed - self.session.last_refresh
        refresh = self.session.decide(n_committed)
        if self.record_strides:
            row: dict[str, Any] = {"stride": n_committed // self.stride, "position": n_committed, "age": age_before}
            row.update({name: value for name, value in self.session.last_signals.items()})
            row["refreshed"] = refresh
            row["retained_mass"] = cache.retained_mass(self.stride)
            self.strides.append(row)
        return refresh
