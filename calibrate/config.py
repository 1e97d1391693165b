"""``CalibrationConfig``: every setting of one calibration, checked once, when it is made.

:func:`~rift_ada.calibrate.pipeline.calibrate` takes the probe traces, the run directory and one of
these; the checks that need the traces (manifest match, signal columns, probed ages) run there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rift_ada.calibrate.grids import SIGNALS
from rift_ada.calibrate.splits import CalibrationError, split_fractions
from rift_ada.calibrate.study import DEFAULT_INTERVALS, SEARCH_REPLICAS, baseline_labels, check_study_size
from rift_ada.policies.replay import DEFAULT_REPLICAS
from rift_ada.policies.space import FAMILIES

DEFAULT_MARGIN = 0.01  # non-inferiority margin: 1% of the reference AL
OBJECTIVES: tuple[str, ...] = ("matched_al", "curve")


class ConfigError(CalibrationError):
    """A calibration setting is invalid; ``field`` names it (the CLI maps it to its option)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


@dataclass(frozen=True)
class CalibrationConfig:
    """What to calibrate and how: everything but the traces, the run directory and the I/O callbacks.

    ``name`` / ``draft`` / ``target`` / ``temperature``: the controller's identity (the traces' manifest
    must match). ``trials``: searched trials (the baselines come on top); ``timeout``: seconds of search per
    worker; ``storage``: Optuna storage URL (``None``: SQLite in the run directory); ``workers``: processes
    filling the study; ``seed``: splits, sampler and bootstrap. ``split``: calibration / selection /
    confirmation shares. ``reference_interval``: the periodic Δ whose AL the controller must match;
    ``intervals``: the periodic baseline grid. ``families``: searched policy families. ``manifest_hash``:
    provenance of a trace directory. ``signals``: the signals the search may use (``None``: all the traces
    carry). ``study_name``: default ``rift-ada-<name>``. ``position_bin``: AL-by-position bin width.
    ``n_resamples``: bootstrap resamples. ``cache`` / ``schedule``: controller field overrides (default: the
    traces' manifest cache and decision stride). ``margin``: non-inferiority margin of "AL kept", a fraction
    of the reference AL. ``search_replicas`` / ``confirm_replicas``: replay's sampling replicas at T > 0 in
    the study and in the confirmation. ``objective``: ``matched_al`` or ``curve`` (ties within
    ``selection_margin`` AL go to the fewest refreshes).
    """

    name: str
    draft: str
    target: str
    temperature: float
    trials: int = 200
    timeout: float | None = None
    storage: str | None = None
    workers: int = 1
    seed: int = 0
    split: Sequence[float] = (0.4, 0.3, 0.3)
    reference_interval: int = 128
    families: Sequence[str] = ("gate", "score")
    manifest_hash: str | None = None
    signals: Sequence[str] | None = None
    intervals: Sequence[int] = DEFAULT_INTERVALS
    study_name: str | None = None
    position_bin: int = 256
    n_resamples: int = 9999
    cache: Mapping[str, Any] | None = None
    schedule: Mapping[str, Any] | None = None
    margin: float = DEFAULT_MARGIN
    search_replicas: int = SEARCH_REPLICAS
    confirm_replicas: int = DEFAULT_REPLICAS
    objective: Literal["matched_al", "curve"] = "matched_al"
    selection_margin: float = 0.02

    def __post_init__(self) -> None:
        # Sequences are kept as tuples and mappings as copies, so the config cannot change after its checks.
        for key in ("split", "families", "intervals"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        if self.signals is not None:
            object.__setattr__(self, "signals", tuple(self.signals))
        for key in ("cache", "schedule"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, dict(getattr(self, key)))
        self.validate()

    def validate(self) -> None:
        """Refuse a setting no calibration can run with (:class:`ConfigError` naming the field)."""
        _check("trials", lambda: check_study_size(self.trials, 1))
        _check("workers", lambda: check_study_size(0, self.workers))
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError("timeout", f"timeout must be a positive number of seconds or None, got {self.timeout}")
        if self.seed < 0:
            raise ConfigError("seed", f"seed must be non-negative, got {self.seed}")
        _check("split", lambda: split_fractions(self.split))
        _check("reference_interval", lambda: baseline_labels((), self.reference_interval))
        _check("intervals", lambda: baseline_labels(self.intervals, self.reference_interval))
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ConfigError(
                "families", f"families must be a non-empty subset of {list(FAMILIES)}, got {list(self.families)}"
            )
        if self.signals is not None:
            unknown = [s for s in self.signals if s not in SIGNALS]
            if unknown or not self.signals:
                raise ConfigError(
                    "signals", f"signals must be a non-empty subset of {list(SIGNALS)}, got {list(self.signals)}"
                )
            twice = sorted({s for s in self.signals if self.signals.count(s) > 1})
            if twice:
                raise ConfigError("signals", f"signals name {', '.join(twice)} twice: {list(self.signals)}")
        for key in ("search_replicas", "confirm_replicas"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"replicas must be >= 1, got {key}={getattr(self, key)}")
        if self.objective not in OBJECTIVES:
            raise ConfigError("objective", f"objective must be 'matched_al' or 'curve', got {self.objective!r}")
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError("margin", f"margin must be a fraction of the reference AL in [0, 1), got {self.margin}")


def _check(field: str, check: Callable[[], object]) -> None:
    """Run a shared check (study, splits) and name ``field`` in what it refuses."""
    try:
        check()
    except ConfigError:
        raise
    except CalibrationError as error:
        raise ConfigError(field, str(error)) from error
