"""RIFT-ada controller: loads and validates controller JSON (version 1) and drives refresh decisions.

Standard library only, so that a serving stack can import it without numpy or torch. The same
object drives the replay parity tests and real serving loops::

    ctl = Controller.load("controller.json")
    session = ctl.new_session()                      # one per request; the prefill counts as a refresh
    session.record_round(accepted_len, draft_entropies)
    session.record_queries(summary)                  # or session.record_query_drift(value)
    if session.decide(n_committed):
        cache.refresh()

Semantics are documented in docs/controller.md.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rift_ada import policy_kinds
from rift_ada.policy_kinds import POLICY_KINDS, knot_transform
from rift_ada.scorers.registry import SCORER_NAMES
from rift_ada.validation import (
    MAX_DEPTH,
    MAX_INTEGER,
    MAX_STRING_LENGTH,
    OPERATORS,
    SIGNAL_NAMES,
    ControllerError,
    FiresFn,
    _describe,
    _integer,
    _is_bool,
    _number,
    _object,
    _parse_int,
    _plain_json,
    _shown,
    _string,
)

__all__ = [
    "CONTROLLER_FORMAT",
    "CONTROLLER_VERSION",
    "DEFAULT_CACHE",
    "DEFAULT_SCHEDULE",
    "DEFAULT_SIGNALS",
    "MAX_CONTROLLER_BYTES",
    "MAX_DEPTH",
    "MAX_INTEGER",
    "MAX_STRING_LENGTH",
    "OPERATORS",
    "POLICY_KINDS",
    "SIGNAL_NAMES",
    "Controller",
    "ControllerError",
    "Session",
    "knot_transform",
    "make_controller_dict",
    "validate_controller_dict",
    "validate_policy",
]

CONTROLLER_FORMAT = "rift-ada.controller"
CONTROLLER_VERSION = 1
MAX_CONTROLLER_BYTES = 1 << 20  # a controller file larger than 1 MiB is refused before it is parsed

DEFAULT_CACHE: dict[str, Any] = {
    "budget": 8192,
    "sw_ratio": 0.5,
    "scorer": "snapkv",
    "block_size": 128,
    "obs_window": 64,
}
DEFAULT_SCHEDULE: dict[str, int] = {"decision_stride": 8, "min_age": 32, "max_age": 768}
DEFAULT_SIGNALS: dict[str, Any] = {"acceptance": {"ewma_alpha": 0.4, "rounds": 4}}

_TOP_REQUIRED = (
    "format",
    "version",
    "name",
    "draft",
    "target",
    "temperature",
    "cache",
    "schedule",
    "signals",
    "policy",
)
_TOP_OPTIONAL = ("calibration",)
_NAN = float("nan")


def _validate_cache(value: Any) -> dict[str, Any]:
    path = "cache"
    obj = _object(value, path, tuple(DEFAULT_CACHE))
    sw_ratio = _number(obj["sw_ratio"], "cache.sw_ratio")
    if not 0.0 < sw_ratio <= 1.0:
        raise ControllerError("cache.sw_ratio", f"must be in (0, 1], got {sw_ratio}")
    block_size = obj["block_size"]
    return {
        "budget": _integer(obj["budget"], "cache.budget", 1),
        "sw_ratio": sw_ratio,
        "scorer": _scorer(obj["scorer"]),
        "block_size": None if block_size is None else _integer(block_size, "cache.block_size", 1),
        "obs_window": _integer(obj["obs_window"], "cache.obs_window", 1),
    }


def _scorer(value: Any) -> str:
    name = _string(value, "cache.scorer")
    if name not in SCORER_NAMES:
        raise ControllerError("cache.scorer", f"unknown scorer {name!r}; valid scorers: {', '.join(SCORER_NAMES)}")
    return name


def _validate_schedule(value: Any) -> dict[str, int]:
    obj = _object(value, "schedule", tuple(DEFAULT_SCHEDULE))
    stride = _integer(obj["decision_stride"], "schedule.decision_stride", 1)
    min_age = _integer(obj["min_age"], "schedule.min_age", 0)
    max_age = _integer(obj["max_age"], "schedule.max_age", 0)
    if max_age < min_age:
        raise ControllerError("schedule.max_age", f"must be >= schedule.min_age ({min_age}), got {max_age}")
    return {"decision_stride": stride, "min_age": min_age, "max_age": max_age}


def _validate_signals(value: Any) -> dict[str, Any]:
    obj = _object(value, "signals", ("acceptance",))
    acc = _object(obj["acceptance"], "signals.acceptance", ("ewma_alpha", "rounds"))
    alpha = _number(acc["ewma_alpha"], "signals.acceptance.ewma_alpha")
    if not 0.0 < alpha <= 1.0:
        raise ControllerError("signals.acceptance.ewma_alpha", f"must be in (0, 1], got {alpha}")
    rounds = _integer(acc["rounds"], "signals.acceptance.rounds", 1)
    return {"acceptance": {"ewma_alpha": alpha, "rounds": rounds}}


def validate_policy(value: Any) -> dict[str, Any]:
    """Validate a ``policy`` object (field paths start with ``policy``); returns a normalised copy."""
    return policy_kinds.from_json(value).to_json()


def validate_controller_dict(data: Any) -> dict[str, Any]:
    """Validate a controller dict (JSON v1) and return a normalised deep copy; raises ControllerError."""
    obj = _object(data, "", _TOP_REQUIRED, _TOP_OPTIONAL)
    fmt = obj["format"]
    if fmt != CONTROLLER_FORMAT:
        raise ControllerError("format", f"expected {CONTROLLER_FORMAT!r}, got {_shown(fmt)}")
    version = obj["version"]
    if _is_bool(version) or not isinstance(version, numbers.Integral) or int(version) != CONTROLLER_VERSION:
        raise ControllerError("version", f"unsupported version {_shown(version)} (this loader reads version 1)")
    temperature = _number(obj["temperature"], "temperature")
    if temperature < 0.0:
        raise ControllerError("temperature", f"must be >= 0, got {temperature}")
    result: dict[str, Any] = {
        "format": CONTROLLER_FORMAT,
        "version": CONTROLLER_VERSION,
        "name": _string(obj["name"], "name"),
        "draft": _string(obj["draft"], "draft"),
        "target": _string(obj["target"], "target"),
        "temperature": temperature,
        "cache": _validate_cache(obj["cache"]),
        "schedule": _validate_schedule(obj["schedule"]),
        "signals": _validate_signals(obj["signals"]),
        "policy": validate_policy(obj["policy"]),
    }
    if "calibration" in obj:
        calibration = obj["calibration"]
        if not isinstance(calibration, Mapping):
            raise ControllerError("calibration", f"expected an object, got {_describe(calibration)}")
        result["calibration"] = _plain_json(calibration, "calibration", 1)
    return result


# ----------------------------------------------------------------------------------------------


class Controller:
    """A validated RIFT-ada controller (JSON v1). Immutable once built; sessions hold per-request state."""

    def __init__(self, data: dict[str, Any]) -> None:
        """Use :meth:`load` or :meth:`from_dict`; ``data`` must already be validated."""
        self._data = data
        self.name: str = data["name"]
        self.draft: str = data["draft"]
        self.target: str = data["target"]
        self.temperature: float = data["temperature"]
        schedule = data["schedule"]
        self.decision_stride: int = schedule["decision_stride"]
        self.min_age: int = schedule["min_age"]
        self.max_age: int = schedule["max_age"]
        acceptance = data["signals"]["acceptance"]
        self.ewma_alpha: float = acceptance["ewma_alpha"]
        self.acceptance_rounds: int = acceptance["rounds"]
        kind = policy_kinds.from_json(data["policy"])
        self.policy_kind: str = kind.kind
        self.signals_used: frozenset[str] = kind.signals()
        self._fires: FiresFn = kind.compile()

    @classmethod
    def from_dict(cls, data: Any) -> Controller:
        """Validate a controller dict; raises ControllerError naming the offending field."""
        return cls(validate_controller_dict(data))

    @classmethod
    def load(cls, path: str | Path) -> Controller:
        """Read and validate a controller JSON file; raises ControllerError naming the file or field."""
        path = Path(path)
        try:
            with path.open("rb") as handle:  # read at most the limit (+1 byte to detect a larger file)
                raw = handle.read(MAX_CONTROLLER_BYTES + 1)
            if len(raw) > MAX_CONTROLLER_BYTES:
                raise ControllerError(str(path), f"controller file larger than {MAX_CONTROLLER_BYTES} bytes (1 MiB)")
            text = raw.decode("utf-8")
        except FileNotFoundError:
            raise ControllerError(str(path), "controller file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ControllerError(str(path), f"cannot read controller file: {exc}") from None
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_int=_parse_int)
        except json.JSONDecodeError as exc:
            raise ControllerError(str(path), f"not valid JSON: {exc}") from None
        except RecursionError:
            raise ControllerError(str(path), "JSON nesting too deep") from None
        except _DuplicateKey as exc:
            raise ControllerError(str(path), f"duplicate key {_shown(exc.args[0])}") from None
        try:
            return cls.from_dict(data)
        except ControllerError as exc:
            raise ControllerError(exc.field, f"{exc.problem} (in {path})") from None

    def to_dict(self) -> dict[str, Any]:
        """The normalised controller dict (a deep copy; JSON-serialisable)."""
        return copy.deepcopy(self._data)

    @property
    def policy(self) -> dict[str, Any]:
        return copy.deepcopy(self._data["policy"])

    def new_session(self) -> Session:
        """Per-request state; the prefill (n_committed = 0) counts as a refresh."""
        return Session(self)

    def __repr__(self) -> str:
        return f"Controller(name={self.name!r}, policy={self.policy_kind!r}, T={self.temperature})"


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _unit_vectors(summary: Iterable[Iterable[Iterable[float]]]) -> list[list[list[float]]]:
    layers = []
    for layer in summary:
        groups = []
        for vector in layer:
            values = [float(x) for x in vector]
            norm = math.sqrt(math.fsum(x * x for x in values))
            groups.append([x / norm for x in values] if norm > 0.0 else [0.0] * len(values))
        layers.append(groups)
    return layers


def _mean_cosine(now: list[list[list[float]]], ref: list[list[list[float]]]) -> float:
    if len(now) != len(ref):
        raise ValueError(f"query summary has {len(now)} layers, the reference has {len(ref)}")
    total = 0.0
    count = 0
    for layer_now, layer_ref in zip(now, ref, strict=True):
        if len(layer_now) != len(layer_ref):
            raise ValueError("query summary: KV-group count differs from the reference")
        for a, b in zip(layer_now, layer_ref, strict=True):
            if len(a) != len(b):
                raise ValueError("query summary: vector length differs from the reference")
            total += sum(x * y for x, y in zip(a, b, strict=True))
            count += 1
    return total / count if count else _NAN


class Session:
    """Refresh-decision state of one request. See docs/controller.md for the exact semantics."""

    __slots__ = (
        "_alpha",
        "_base_acceptance",
        "_base_entropy",
        "_decision_index",
        "_drift",
        "_drift_mode",
        "_entropy_count",
        "_entropy_sum",
        "_fires",
        "_max_age",
        "_min_age",
        "_one_minus_alpha",
        "_query_now",
        "_query_ref",
        "_refresh_n",
        "_rounds",
        "_signals",
        "_since_refresh",
        "_stride",
        "decisions",
        "refresh_positions",
        "refreshes",
    )

    def __init__(self, controller: Controller) -> None:
        self._fires = controller._fires
        self._stride = controller.decision_stride
        self._min_age = controller.min_age
        self._max_age = controller.max_age
        self._alpha = controller.ewma_alpha
        self._one_minus_alpha = 1.0 - controller.ewma_alpha
        self._rounds: deque[float] = deque(maxlen=controller.acceptance_rounds)
        self._since_refresh = 0  # rounds completed since the last refresh (or the prefill)
        self._entropy_sum = 0.0
        self._entropy_count = 0
        self._drift = _NAN
        self._drift_mode = 0  # 0: none, 1: explicit value, 2: from query summaries
        self._query_now: list[list[list[float]]] | None = None
        self._query_ref: list[list[list[float]]] | None = None
        self._base_acceptance = _NAN
        self._base_entropy = _NAN
        self._refresh_n = 0
        self._decision_index = 0
        self._signals: list[float] | None = None
        self.refreshes = 0
        self.decisions = 0
        self.refresh_positions: list[int] = []

    # -- inputs -----------------------------------------------------------------------------

    def record_round(self, accepted_len: float, draft_entropies: Iterable[float] = ()) -> None:
        """Record one verification round: its AL (accepted drafted tokens + 1) and its draft entropies."""
        self._rounds.append(float(accepted_len))
        self._since_refresh += 1
        total = 0.0
        count = 0
        for entropy in draft_entropies:
            total += float(entropy)
            count += 1
        if count:
            self._entropy_sum += total
            self._entropy_count += count

    def record_queries(self, summary: Iterable[Iterable[Iterable[float]]]) -> None:
        """Store the latest query summary: per full-attention layer, per KV group, the mean pre-RoPE query.

        The first summary recorded while no reference is held (e.g. the prefill's) becomes the
        reference. Query drift = 1 - mean over layers and groups of unit(q_now) . unit(q_ref).
        """
        now = _unit_vectors(summary)
        if self._query_ref is None:
            self._query_ref = now
        self._drift = 1.0 - _mean_cosine(now, self._query_ref)
        self._query_now = now
        self._drift_mode = 2

    def record_query_drift(self, value: float) -> None:
        """Record query drift computed by the caller (serving stacks on device, replay). NaN = missing."""
        self._drift = float(value)
        self._drift_mode = 1

    # -- decision ---------------------------------------------------------------------------

    def decide(self, n_committed: int) -> bool:
        """Return True when the working set must be refreshed now (the session resets itself)."""
        index = n_committed // self._stride
        if index <= self._decision_index:
            return False
        self._decision_index = index
        self.decisions += 1
        rounds = self._rounds
        if rounds:
            alpha = self._alpha
            one_minus_alpha = self._one_minus_alpha
            iterator = iter(rounds)
            acceptance = next(iterator)
            for accepted_len in iterator:
                acceptance = alpha * accepted_len + one_minus_alpha * acceptance
        else:
            acceptance = _NAN
        if self._entropy_count:
            entropy = self._entropy_sum / self._entropy_count
            self._entropy_sum = 0.0
            self._entropy_count = 0
        else:
            entropy = _NAN
        # Baselines: the values at the first decision whose acceptance window lies after the refresh.
        ready = self._since_refresh >= self._rounds.maxlen
        if ready and self._base_acceptance != self._base_acceptance and acceptance == acceptance:
            self._base_acceptance = acceptance
        if ready and self._base_entropy != self._base_entropy and entropy == entropy:
            self._base_entropy = entropy
        acceptance_drop = self._base_acceptance - acceptance  # NaN while no baseline is held
        entropy_rise = entropy - self._base_entropy
        signals = [acceptance, entropy, self._drift, acceptance_drop, entropy_rise]
        self._signals = signals
        age = n_committed - self._refresh_n
        if age >= self._max_age or (age >= self._min_age and self._fires(signals, age)):
            self._refresh(n_committed)
            return True
        return False

    def _refresh(self, n_committed: int) -> None:
        self._refresh_n = n_committed
        self.refreshes += 1
        self.refresh_positions.append(n_committed)
        self._base_acceptance = _NAN
        self._base_entropy = _NAN
        self._since_refresh = 0
        if self._drift_mode == 2:
            self._query_ref = self._query_now
            self._drift = 0.0
        elif self._drift_mode == 1:
            self._drift = _NAN
            self._drift_mode = 0

    # -- debugging --------------------------------------------------------------------------

    @property
    def last_refresh(self) -> int:
        """n_committed at the last refresh (0 = the prefill)."""
        return self._refresh_n

    @property
    def last_signals(self) -> dict[str, float | None]:
        """Signals at the latest decision (None = missing); empty before the first decision."""
        if self._signals is None:
            return {}
        return {name: (None if v != v else v) for name, v in zip(SIGNAL_NAMES, self._signals, strict=True)}


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    merged = copy.deepcopy(dict(defaults))
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def make_controller_dict(
    policy: Mapping[str, Any],
    *,
    name: str,
    draft: str,
    target: str,
    temperature: float,
    cache: Mapping[str, Any] | None = None,
    schedule: Mapping[str, Any] | None = None,
    signals: Mapping[str, Any] | None = None,
    calibration: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A validated controller dict; ``cache``/``schedule``/``signals`` override the defaults key by key."""
    data: dict[str, Any] = {
        "format": CONTROLLER_FORMAT,
        "version": CONTROLLER_VERSION,
        "name": name,
        "draft": draft,
        "target": target,
        "temperature": temperature,
        "cache": _merge(DEFAULT_CACHE, cache),
        "schedule": _merge(DEFAULT_SCHEDULE, schedule),
        "signals": _merge(DEFAULT_SIGNALS, signals),
        "policy": dict(policy),
    }
    if calibration is not None:
        data["calibration"] = dict(calibration)
    return validate_controller_dict(data)
