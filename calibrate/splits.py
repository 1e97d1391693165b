"""Seeded, disjoint, stratified calibration / selection / confirmation splits of probe requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rift_ada.collectors.probe_traces import ProbeTraces

SPLIT_NAMES: tuple[str, str, str] = ("calibration", "selection", "confirmation")


class CalibrationError(ValueError):
    """Calibration cannot proceed with these inputs; the message says why."""


@dataclass(frozen=True)
class Splits:
    """Request indices (into the traces) of each split, plus the request ids for provenance."""

    calibration: np.ndarray
    selection: np.ndarray
    confirmation: np.ndarray
    request_ids: np.ndarray
    strata: np.ndarray
    seed: int
    fractions: tuple[float, float, float]

    def indices(self, name: str) -> np.ndarray:
        """Indices of the split called ``name``."""
        if name not in SPLIT_NAMES:
            raise KeyError(f"unknown split {name!r}: expected one of {', '.join(SPLIT_NAMES)}")
        return getattr(self, name)

    @property
    def sizes(self) -> dict[str, int]:
        """Number of requests in each split."""
        return {name: int(len(self.indices(name))) for name in SPLIT_NAMES}

    def assignment(self) -> dict[str, str]:
        """request id -> split name, for every request."""
        out: dict[str, str] = {}
        for name in SPLIT_NAMES:
            for index in self.indices(name):
                out[str(self.request_ids[index])] = name
        return {rid: out[rid] for rid in map(str, self.request_ids)}

    def to_dict(self) -> dict[str, object]:
        """JSON-ready record: seed, fractions, sizes and the request ids of each split."""
        return {
            "seed": self.seed,
            "fractions": list(self.fractions),
            "sizes": self.sizes,
            "stratified_by": ["category", "isl_bucket"],
            "request_ids": {name: [str(self.request_ids[i]) for i in self.indices(name)] for name in SPLIT_NAMES},
        }


def isl_buckets(isl: np.ndarray, n_buckets: int = 3) -> np.ndarray:
    """Bucket index of each input length by quantiles of log(ISL); ties stay in one bucket."""
    values = np.log(np.maximum(np.asarray(isl, dtype=np.float64), 1.0))
    if len(values) == 0 or n_buckets <= 1:
        return np.zeros(len(values), dtype=np.int64)
    distinct = np.unique(values)
    if len(distinct) <= n_buckets:
        return np.searchsorted(distinct, values).astype(np.int64)
    edges = np.unique(np.quantile(values, np.linspace(0.0, 1.0, n_buckets + 1)[1:-1]))
    return np.searchsorted(edges, values, side="right").astype(np.int64)


def split_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    """The three split shares as floats; refuses anything but three non-negative numbers with a positive sum."""
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(not np.isfinite(f) or f < 0 for f in fr) or sum(fr) <= 0:
        raise CalibrationError(f"split fractions must be three non-negative numbers, got {list(fractions)}")
    return (fr[0], fr[1], fr[2])


def make_splits(
    traces: ProbeTraces,
    fractions: Sequence[float] = (0.4, 0.3, 0.3),
    *,
    seed: int = 0,
    n_isl_buckets: int = 3,
) -> Splits:
    """Split requests into calibration / selection / confirmation, stratified by category and ISL.

    Requests are grouped by (category, ISL bucket); strata are visited in a seeded order and the
    requests of each in a seeded order, and each request goes to the split whose share is most
    behind its target so far. Global sizes are within one request of ``fraction * n`` and every
    stratum is spread proportionally. Raises :class:`CalibrationError` if a split comes out empty.
    """
    fr = split_fractions(fractions)
    total = sum(fr)
    fr = (fr[0] / total, fr[1] / total, fr[2] / total)
    n = traces.n_requests
    ids = np.asarray(traces.requests["request_id"]).astype(str)
    if len(np.unique(ids)) != n:
        raise CalibrationError("request ids in the traces are not unique")
    category = np.asarray(traces.requests["category"]).astype(str)
    bucket = isl_buckets(np.asarray(traces.requests["isl"]), n_isl_buckets)
    strata_keys = np.array([f"{c}|isl{b}" for c, b in zip(category, bucket, strict=True)])

    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5E11]))
    unique_strata = sorted(set(strata_keys.tolist()))
    order_of_strata = rng.permutation(len(unique_strata))
    ordered: list[int] = []
    for s in order_of_strata:
        members = np.flatnonzero(strata_keys == unique_strata[s])
        ordered.extend(members[rng.permutation(len(members))].tolist())

    counts = np.zeros(3)
    target = np.asarray(fr)
    label = np.empty(n, dtype=np.int64)
    for k, index in enumerate(ordered):
        deficit = target * (k + 1) - counts
        choice = int(np.argmax(deficit))
        label[index] = choice
        counts[choice] += 1

    parts = [np.sort(np.flatnonzero(label == j)) for j in range(3)]
    sizes = {name: len(p) for name, p in zip(SPLIT_NAMES, parts, strict=True)}
    if any(size == 0 for size in sizes.values()):
        described = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise CalibrationError(
            f"a split came out empty ({described} of {n} requests, fractions "
            f"{'/'.join(f'{f:.2f}' for f in fr)}): collect more requests or change the split"
        )
    return Splits(
        calibration=parts[0],
        selection=parts[1],
        confirmation=parts[2],
        request_ids=ids,
        strata=strata_keys,
        seed=int(seed),
        fractions=fr,
    )
