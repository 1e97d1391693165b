"""Policy specs: the one parser of a policy spec string and the one place its label is made.

A spec names what a replay or a closed-loop run does with the draft's working set:

* ``stat`` (also ``rift-stat``): RIFT-stat, the prefill selection kept for the whole decode;
* ``full``: no compression;
* ``swa``, ``streamingllm``, ``h2o``, ``snapkv``, ``triattention``: cache baselines (closed loop only);
* ``periodic:N`` and ``dyn:N``: RIFT-dyn, a refresh every N committed tokens (N >= 1);
* a controller JSON file (RIFT-ada): a string ending in ``.json`` or naming an existing file.

:func:`parse` is the only place a spec string is read and :attr:`PolicySpec.label` the only place
one is written (``parse(spec.label) == spec``); :meth:`PolicySpec.schedule` is the one derivation of
a periodic spec's ages. Standard library only, like :mod:`rift_ada.controller`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift_ada.controller import DEFAULT_SCHEDULE, make_controller_dict
from rift_ada.policy_kinds import Periodic

__all__ = [
    "CACHE_BASELINES",
    "CONTROLLER",
    "DYN",
    "FULL",
    "PERIODIC",
    "REPLAY_FORMS",
    "SPEC_FORMS",
    "STAT",
    "PolicySpec",
    "parse",
    "periodic_label",
]

STAT = "stat"
FULL = "full"
PERIODIC = "periodic"
DYN = "dyn"  # RIFT-dyn's spelling of ``periodic``: the same refresh schedule
CONTROLLER = "controller"
CACHE_BASELINES = ("swa", "streamingllm", "h2o", "snapkv", "triattention")  # closed loop only
_ALIASES = {"rift-stat": STAT}
_INTERVAL_KINDS = (PERIODIC, DYN)
_NAMED_KINDS = (STAT, FULL, *CACHE_BASELINES)
SPEC_FORMS = f"{STAT}, {FULL}, {', '.join(CACHE_BASELINES)}, periodic:N, dyn:N or a controller JSON file"
REPLAY_FORMS = "stat, full, periodic:N, dyn:N or a controller JSON file"


@dataclass(frozen=True)
class PolicySpec:
    """One parsed policy spec: its ``kind``, the ``interval`` of ``periodic``/``dyn``, the ``path`` of a controller."""

    kind: str
    interval: int | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if self.kind in _INTERVAL_KINDS:
            if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
                raise ValueError(f"policy {self.kind}: interval must be an integer >= 1, got {self.interval!r}")
        elif self.interval is not None:
            raise ValueError(f"policy {self.kind!r} takes no interval, got {self.interval!r}")
        if self.kind == CONTROLLER:
            if not isinstance(self.path, str) or not self.path:
                raise ValueError(f"policy {CONTROLLER}: path must be a non-empty string, got {self.path!r}")
        elif self.path is not None:
            raise ValueError(f"policy {self.kind!r} takes no path, got {self.path!r}")
        if self.kind not in (*_NAMED_KINDS, *_INTERVAL_KINDS, CONTROLLER):
            raise ValueError(f"unknown policy kind {self.kind!r}: use one of {SPEC_FORMS}")

    @classmethod
    def periodic(cls, interval: int) -> PolicySpec:
        """``periodic:interval``."""
        return cls(PERIODIC, interval=interval)

    @property
    def label(self) -> str:
        """The spec's text: ``stat``, ``periodic:64``, a controller file's path (``parse`` reads it back)."""
        if self.interval is not None:
            return f"{self.kind}:{self.interval}"
        return self.path if self.path is not None else self.kind

    @property
    def is_periodic(self) -> bool:
        """``periodic:N`` or ``dyn:N``."""
        return self.kind in _INTERVAL_KINDS

    @property
    def replayable(self) -> bool:
        """Whether replay over probe traces can run it (the cache baselines need the closed loop)."""
        return self.kind not in CACHE_BASELINES

    def as_periodic(self) -> PolicySpec:
        """``dyn:N`` as ``periodic:N`` (the closed loop labels both so); other specs unchanged."""
        return PolicySpec.periodic(self.interval) if self.kind == DYN and self.interval is not None else self

    def schedule(self, default_max_age: int = DEFAULT_SCHEDULE["max_age"]) -> dict[str, int]:
        """Ages of a periodic spec's controller: ``min_age`` 0 (so intervals below the default 32 are
        honoured) and ``max_age`` max(default, N) (so intervals above it are too)."""
        if self.interval is None:
            raise ValueError(f"policy {self.label!r} has no refresh interval")
        return {"min_age": 0, "max_age": max(int(default_max_age), self.interval)}

    def controller(
        self,
        *,
        draft: str,
        target: str,
        temperature: float,
        name: str | None = None,
        cache: dict[str, Any] | None = None,
        decision_stride: int | None = None,
    ) -> dict[str, Any]:
        """The validated controller dict of a periodic spec (named by its label unless ``name`` is given)."""
        schedule: dict[str, int] = self.schedule()
        if decision_stride is not None:
            schedule = {"decision_stride": decision_stride, **schedule}
        return make_controller_dict(
            Periodic(self.interval).to_json(),
            name=self.label if name is None else name,
            draft=draft,
            target=target,
            temperature=temperature,
            cache=cache,
            schedule=schedule,
        )


def periodic_label(interval: int) -> str:
    """The label of ``periodic:interval`` (shorthand for ``PolicySpec.periodic(interval).label``)."""
    return PolicySpec.periodic(int(interval)).label


def parse(spec: str | os.PathLike[str] | PolicySpec) -> PolicySpec:
    """The :class:`PolicySpec` of a spec string; ValueError naming the spec when it is none of the forms.

    Names come first (a file named ``stat`` does not shadow the policy); a path object, a string
    ending in ``.json`` or one naming an existing file is a controller file (loaded by the caller).
    """
    if isinstance(spec, PolicySpec):
        return spec
    if isinstance(spec, os.PathLike):
        return PolicySpec(CONTROLLER, path=os.fspath(spec))
    if not isinstance(spec, str):
        raise TypeError(f"policy spec must be a string or a path, got {type(spec).__name__}")
    name = _ALIASES.get(spec, spec)
    if name in _NAMED_KINDS:
        return PolicySpec(name)
    kind, colon, value = spec.partition(":")
    if colon and kind in _INTERVAL_KINDS:
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise ValueError(f"policy {spec!r}: the interval must be an integer >= 1 (e.g. {kind}:64)")
        return PolicySpec(kind, interval=int(value))
    if spec.endswith(".json") or Path(spec).is_file():
        return PolicySpec(CONTROLLER, path=spec)
    raise ValueError(f"unknown policy {spec!r}: use one of {SPEC_FORMS}")
