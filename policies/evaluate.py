"""Evaluate policies by replay, and measure replay's fidelity to closed-loop runs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.controller import Controller
from rift_ada.policies.replay import ReplayResult, replay_many
from rift_ada.policy_spec import CONTROLLER, REPLAY_FORMS, parse

__all__ = ["PolicySpecLike", "evaluate_policies", "fidelity", "resolve_policy_spec"]

PolicySpecLike = str | Path | Mapping[str, Any] | Controller


def resolve_policy_spec(spec: PolicySpecLike) -> tuple[str, dict[str, Any] | str, str]:
    """(label, replayable policy, source) for a policy name, a controller JSON path, a dict or a Controller.

    A string is read by :func:`rift_ada.policy_spec.parse`: a named policy (``stat``, ``full``,
    ``periodic:N``, ``dyn:N``), or a controller file (a path, a string ending in ``.json`` or naming an
    existing file) that loads through :meth:`Controller.load` (ControllerError when invalid or missing).
    Closed-loop-only baselines (``swa``, ``h2o``, ...) are refused with a ValueError.
    """
    if isinstance(spec, Controller):
        return spec.name, spec.to_dict(), "controller"
    if isinstance(spec, Mapping):
        data = Controller.from_dict(spec).to_dict()
        return data["name"], data, "dict"
    parsed = parse(spec)
    if not parsed.replayable:
        raise ValueError(f"policy {parsed.label!r} runs in the closed loop only; replay takes {REPLAY_FORMS}")
    if parsed.kind != CONTROLLER:
        return parsed.label, parsed.label, "named"
    data = Controller.load(spec).to_dict()
    return data["name"], data, str(spec)


def evaluate_policies(
    traces: ProbeTraces, specs: Sequence[PolicySpecLike], *, position_bin: int = 256
) -> list[dict[str, Any]]:
    """Replay every policy over the traces (batched) and return one summary row per spec, in order.

    Row keys: policy, kind, source, n_requests, mean_al, refreshes_per_1k, committed, rounds,
    refreshes, replicas, seed, mean_al_std (T > 0: sampling replicas, their seed and the spread of the
    mean AL), al_by_position (edges and request-mean AL per bin) and, when a ``full`` arm
    exists, al_vs_full (mean AL as a fraction of the full-KV replay's).
    """
    resolved = [resolve_policy_spec(spec) for spec in specs]
    results = replay_many(traces, [policy for _, policy, _ in resolved], position_bin=position_bin)
    full_al = None
    if "full" in traces.arms:
        full_al = next((r.mean_al for (_, p, _), r in zip(resolved, results, strict=True) if p == "full"), None)
        if full_al is None:
            full_al = replay_many(traces, ["full"], position_bin=position_bin)[0].mean_al
    rows = []
    for (label, policy, source), result in zip(resolved, results, strict=True):
        summary = result.to_dict()
        kind = parse(policy).kind if isinstance(policy, str) else policy["policy"]["kind"]
        row = {
            "policy": label,
            "kind": kind,
            "source": source,
            **{
                key: summary[key]
                for key in (
                    "n_requests",
                    "mean_al",
                    "refreshes_per_1k",
                    "committed",
                    "rounds",
                    "refreshes",
                    "replicas",
                    "seed",
                    "mean_al_std",
                    "al_by_position",
                )
            },
        }
        if full_al:
            row["al_vs_full"] = result.mean_al / full_al
        rows.append(row)
    return rows


def _closed_columns(closed_rows: Any) -> dict[str, np.ndarray]:
    if hasattr(closed_rows, "to_pydict"):
        closed_rows = closed_rows.to_pydict()
    if isinstance(closed_rows, Mapping):
        columns = {
            key: np.asarray(closed_rows[key])
            for key in ("request_id", "committed", "rounds", "refreshes")
            if key in closed_rows
        }
    else:
        rows = list(closed_rows)
        columns = {
            key: np.asarray([row[key] for row in rows])
            for key in ("request_id", "committed", "rounds", "refreshes")
            if rows and key in rows[0]
        }
    missing = [k for k in ("request_id", "committed", "rounds", "refreshes") if k not in columns]
    if missing:
        raise ValueError(f"closed-loop rows lack {', '.join(missing)}")
    return columns


def _gap(replayed: float, closed: float) -> tuple[float, float]:
    gap = replayed - closed
    return gap, (gap / closed if closed else math.nan)


def fidelity(replay_result: ReplayResult, closed_rows: Any) -> dict[str, Any]:
    """Compare a replay with closed-loop runs of the same policy on the same requests.

    ``closed_rows``: per-request ``request_id``, ``committed``, ``rounds``, ``refreshes`` as a
    mapping of columns, a sequence of row mappings, or a table with ``to_pydict()`` (pyarrow).
    Only requests present in both are compared. Gaps are replay minus closed loop (relative gaps
    divide by the closed-loop value).
    """
    closed = _closed_columns(closed_rows)
    closed_ids = [str(x) for x in closed["request_id"]]
    replay_ids = [str(x) for x in replay_result.request_ids]
    closed_index = {rid: i for i, rid in enumerate(closed_ids)}
    matched = [(i, closed_index[rid]) for i, rid in enumerate(replay_ids) if rid in closed_index]
    replay_idx = np.array([i for i, _ in matched], dtype=np.int64)
    closed_idx = np.array([j for _, j in matched], dtype=np.int64)
    result: dict[str, Any] = {
        "policy": replay_result.policy,
        "n_matched": len(matched),
        "n_replay_only": len(replay_ids) - len(matched),
        "n_closed_only": len(closed_ids) - len(matched),
    }
    if not matched:
        return result
    r_committed = replay_result.committed[replay_idx].astype(np.float64)
    r_rounds = replay_result.rounds[replay_idx].astype(np.float64)
    r_refreshes = replay_result.refreshes[replay_idx].astype(np.float64)
    c_committed = closed["committed"][closed_idx].astype(np.float64)
    c_rounds = closed["rounds"][closed_idx].astype(np.float64)
    c_refreshes = closed["refreshes"][closed_idx].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        r_al = r_committed / r_rounds
        c_al = c_committed / c_rounds
    replay_mean, closed_mean = float(np.nanmean(r_al)), float(np.nanmean(c_al))
    replay_rate = 1000.0 * r_refreshes.sum() / r_committed.sum() if r_committed.sum() else math.nan
    closed_rate = 1000.0 * c_refreshes.sum() / c_committed.sum() if c_committed.sum() else math.nan
    al_gap, al_gap_rel = _gap(replay_mean, closed_mean)
    rate_gap, rate_gap_rel = _gap(replay_rate, closed_rate)
    both = np.isfinite(r_al) & np.isfinite(c_al)
    corr = math.nan
    if both.sum() > 1 and np.std(r_al[both]) > 0 and np.std(c_al[both]) > 0:
        corr = float(np.corrcoef(r_al[both], c_al[both])[0, 1])
    result.update(
        replay_mean_al=replay_mean,
        closed_mean_al=closed_mean,
        al_gap=al_gap,
        al_gap_rel=al_gap_rel,
        replay_refreshes_per_1k=float(replay_rate),
        closed_refreshes_per_1k=float(closed_rate),
        refreshes_per_1k_gap=float(rate_gap),
        refreshes_per_1k_gap_rel=float(rate_gap_rel),
        per_request_al_mae=float(np.mean(np.abs(r_al[both] - c_al[both]))) if both.any() else math.nan,
        per_request_al_corr=corr,
    )
    return result
