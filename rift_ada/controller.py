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
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rift_ada.scorers.registry import SCORER_NAMES

__all__ = [
    "CONTROLLER_FORMAT",
    "CONTROLLER_VERSION",
    "DEFAULT_CACHE",
    "DEFAULT_SCHEDULE",
    "DEFAULT_SIGNALS",
    "MAX_CONTROLLER_BYTES",
    "MAX_DEPTH",
    "MAX_STRING_LENGTH",
    "OPERATORS",
    "SIGNAL_NAMES",
    "Controller",
    "ControllerError",
    "Session",
    "make_controller_dict",
]

CONTROLLER_FORMAT = "rift-ada.controller"
CONTROLLER_VERSION = 1
SIGNAL_NAMES: tuple[str, ...] = ("acceptance", "entropy", "query_drift", "acceptance_drop", "entropy_rise")
SIGNAL_INDEX: dict[str, int] = {name: index for index, name in enumerate(SIGNAL_NAMES)}
OPERATORS: tuple[str, ...] = ("<=", "<", ">=", ">")
POLICY_KINDS: tuple[str, ...] = ("periodic", "gate", "score")
MAX_DEPTH = 32
MAX_INTEGER = 2**53  # integer fields stay exact in JSON doubles and fit int64 arrays
MAX_CONTROLLER_BYTES = 1 << 20  # a controller file larger than 1 MiB is refused before it is parsed
MAX_STRING_LENGTH = 4096  # characters in any string (names, model ids, provenance values and keys)
_MAX_INTEGER_DIGITS = 20  # longer integer literals are never parsed into ints (no 5,000-digit parses)

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

# A compiled policy: fires(signals, age) -> bool, signals indexed as SIGNAL_NAMES (NaN = missing).
FiresFn = Callable[[list[float], int], bool]


class ControllerError(ValueError):
    """A controller file or dict is invalid; ``field`` names the offending field path (or the file)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


# ----------------------------------------------------------------------------------------------
# Validation helpers. Each returns the normalised value (plain Python types) or raises.


class _OversizeInteger:
    """An integer literal too long to be a valid field (kept unparsed so the field can be named)."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))

    def problem(self) -> str:
        return f"integer out of range ({self.digits} digits; |value| must be <= 2**53)"

    def __repr__(self) -> str:
        return f"<integer of {self.digits} digits>"


def _shown(value: Any, limit: int = 80) -> str:
    """``repr`` of a value for an error message, cut so that hostile input cannot flood it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _parse_int(text: str) -> int | _OversizeInteger:
    return _OversizeInteger(text) if len(text) > _MAX_INTEGER_DIGITS else int(text)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, numbers.Real):
        return "a number"
    if isinstance(value, _OversizeInteger):
        return f"an integer of {value.digits} digits"
    return f"a {type(value).__name__}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _number(value: Any, path: str) -> float:
    if isinstance(value, _OversizeInteger):
        raise ControllerError(path, value.problem())
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ControllerError(path, f"expected a number, got {_describe(value)}")
    try:
        result = float(value)
    except (OverflowError, ValueError, TypeError):
        raise ControllerError(path, "number out of range") from None
    if not math.isfinite(result):
        raise ControllerError(path, f"must be a finite number, got {result!r}")
    return result


def _integer(value: Any, path: str, minimum: int | None = None) -> int:
    if isinstance(value, _OversizeInteger):
        raise ControllerError(path, value.problem())
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ControllerError(path, f"expected an integer, got {_describe(value)}")
    result = int(value)
    if abs(result) > MAX_INTEGER:
        raise ControllerError(path, f"integer out of range (|value| must be <= 2**53, got {_describe(value)})")
    if minimum is not None and result < minimum:
        raise ControllerError(path, f"must be >= {minimum}, got {result}")
    return result


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ControllerError(path, f"expected a string, got {_describe(value)}")
    if not value:
        raise ControllerError(path, "must not be empty")
    return _bounded(value, path)


def _bounded(value: str, path: str) -> str:
    if len(value) > MAX_STRING_LENGTH:
        raise ControllerError(path, f"string of {len(value)} characters is longer than {MAX_STRING_LENGTH}")
    return value


def _object(value: Any, path: str, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping:
    """Check that ``value`` is an object with exactly the required keys and some optional ones."""
    if not isinstance(value, Mapping):
        raise ControllerError(path or "controller", f"expected an object, got {_describe(value)}")
    allowed = set(required) | set(optional)
    for key in value:
        if not isinstance(key, str):
            raise ControllerError(path or "controller", f"keys must be strings, got {_shown(key)}")
        if key not in allowed and len(key) > MAX_STRING_LENGTH:
            raise ControllerError(path or "controller", f"unknown key {_shown(key)}")
        if key not in allowed:
            raise ControllerError(_join(path, key), f"unknown key (allowed: {', '.join(sorted(allowed))})")
    for key in required:
        if key not in value:
            raise ControllerError(_join(path, key), "missing required field")
    return value


def _plain_json(value: Any, path: str, depth: int) -> Any:
    """Copy of a free-form JSON value (calibration provenance): finite numbers, bounded nesting."""
    if depth > MAX_DEPTH:
        raise ControllerError(path, f"nesting deeper than {MAX_DEPTH} levels")
    if value is None:
        return value
    if isinstance(value, str):
        return _bounded(value, path)
    if _is_bool(value):
        return bool(value)
    if isinstance(value, (numbers.Integral, _OversizeInteger)):
        return _integer(value, path)
    if isinstance(value, numbers.Real):
        return _number(value, path)
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ControllerError(path, f"keys must be strings, got {_shown(key)}")
            _bounded(key, path)
            result[key] = _plain_json(item, _join(path, key), depth + 1)
        return result
    if isinstance(value, (list, tuple)):
        return [_plain_json(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    raise ControllerError(path, f"not a JSON value: {_describe(value)}")


def _signal(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ControllerError(path, f"expected a signal name, got {_describe(value)}")
    if value not in SIGNAL_INDEX:
        raise ControllerError(path, f"unknown signal {_shown(value)} (known: {', '.join(SIGNAL_NAMES)})")
    return value


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


def _validate_gate_node(node: Any, path: str, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise ControllerError(path, f"nesting deeper than {MAX_DEPTH} levels")
    if not isinstance(node, Mapping):
        raise ControllerError(path, f"expected a rule or an any/all group object, got {_describe(node)}")
    groups = [key for key in ("any", "all") if key in node]
    if len(groups) > 1:
        raise ControllerError(path, "has both 'any' and 'all'; nest them instead")
    if groups:
        key = groups[0]
        _object(node, path, (key,))
        return {key: _validate_gate_children(node[key], _join(path, key), depth)}
    _object(node, path, ("signal", "op", "value"))
    op = node["op"]
    if not isinstance(op, str) or op not in OPERATORS:
        shown = op if isinstance(op, str) else _describe(op)
        raise ControllerError(_join(path, "op"), f"unknown operator {_shown(shown)} (allowed: {' '.join(OPERATORS)})")
    return {
        "signal": _signal(node["signal"], _join(path, "signal")),
        "op": op,
        "value": _number(node["value"], _join(path, "value")),
    }


def _validate_gate_children(children: Any, path: str, depth: int) -> list[dict[str, Any]]:
    if not isinstance(children, (list, tuple)):
        raise ControllerError(path, f"expected a list of rules or groups, got {_describe(children)}")
    if not children:
        raise ControllerError(path, "must not be empty")
    return [_validate_gate_node(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(children)]


def _validate_knots(value: Any, path: str) -> list[list[float]]:
    if not isinstance(value, (list, tuple)):
        raise ControllerError(path, f"expected a list of [x, y] pairs, got {_describe(value)}")
    if len(value) < 2:
        raise ControllerError(path, "needs at least 2 knots")
    knots: list[list[float]] = []
    for index, pair in enumerate(value):
        item_path = f"{path}[{index}]"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ControllerError(item_path, "expected an [x, y] pair")
        x = _number(pair[0], f"{item_path}[0]")
        y = _number(pair[1], f"{item_path}[1]")
        if knots and x <= knots[-1][0]:
            raise ControllerError(f"{item_path}[0]", "knot x values must be strictly increasing")
        if knots and y < knots[-1][1]:
            raise ControllerError(f"{item_path}[1]", "knot y values must be non-decreasing (monotone)")
        knots.append([x, y])
    return knots


def _validate_score_term(term: Any, path: str) -> dict[str, Any]:
    obj = _object(term, path, ("signal", "orientation", "mean", "scale", "weight"), ("knots",))
    orientation = obj["orientation"]
    if _is_bool(orientation) or not isinstance(orientation, numbers.Real) or orientation not in (1, -1):
        raise ControllerError(_join(path, "orientation"), "must be +1 or -1")
    scale = _number(obj["scale"], _join(path, "scale"))
    if scale <= 0.0:
        raise ControllerError(_join(path, "scale"), f"must be > 0, got {scale}")
    weight = _number(obj["weight"], _join(path, "weight"))
    if weight < 0.0:
        raise ControllerError(_join(path, "weight"), f"must be >= 0, got {weight}")
    result: dict[str, Any] = {
        "signal": _signal(obj["signal"], _join(path, "signal")),
        "orientation": int(orientation),
        "mean": _number(obj["mean"], _join(path, "mean")),
        "scale": scale,
        "weight": weight,
    }
    if "knots" in obj:
        result["knots"] = _validate_knots(obj["knots"], _join(path, "knots"))
    return result


def validate_policy(value: Any) -> dict[str, Any]:
    """Validate a ``policy`` object (field paths start with ``policy``); returns a normalised copy."""
    path = "policy"
    if not isinstance(value, Mapping):
        raise ControllerError(path, f"expected an object, got {_describe(value)}")
    if "kind" not in value:
        raise ControllerError("policy.kind", "missing required field")
    kind = value["kind"]
    if not isinstance(kind, str) or kind not in POLICY_KINDS:
        raise ControllerError("policy.kind", f"unknown policy kind {_shown(kind)} (known: {', '.join(POLICY_KINDS)})")
    if kind == "periodic":
        obj = _object(value, path, ("kind", "interval"))
        return {"kind": kind, "interval": _integer(obj["interval"], "policy.interval", 1)}
    if kind == "gate":
        groups = [key for key in ("any", "all") if key in value]
        if not groups:
            raise ControllerError("policy.any", "a gate policy needs 'any' or 'all'")
        if len(groups) > 1:
            raise ControllerError(path, "has both 'any' and 'all'; nest them instead")
        key = groups[0]
        _object(value, path, ("kind", key))
        return {"kind": kind, key: _validate_gate_children(value[key], f"policy.{key}", 1)}
    obj = _object(value, path, ("kind", "terms", "threshold"))
    terms = obj["terms"]
    if not isinstance(terms, (list, tuple)):
        raise ControllerError("policy.terms", f"expected a list of terms, got {_describe(terms)}")
    if not terms:
        raise ControllerError("policy.terms", "must not be empty")
    return {
        "kind": kind,
        "terms": [_validate_score_term(term, f"policy.terms[{i}]") for i, term in enumerate(terms)],
        "threshold": _number(obj["threshold"], "policy.threshold"),
    }


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
# Policy compilation: closures over a signal list, built once at load time.


def knot_transform(knots: Sequence[Sequence[float]]) -> Callable[[float], float]:
    """Monotone piecewise-linear map through ``knots``; constant (clamped) outside the first/last knot.

    Inside segment i (xs[i] <= z < xs[i+1]) the value is ``ys[i] + slopes[i] * (z - xs[i])`` with
    ``slopes[i] = (ys[i+1] - ys[i]) / (xs[i+1] - xs[i])``; replay evaluates the same expression.
    """
    xs = [float(x) for x, _ in knots]
    ys = [float(y) for _, y in knots]
    slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    x_first, x_last, y_first, y_last = xs[0], xs[-1], ys[0], ys[-1]

    def transform(z: float) -> float:
        if z <= x_first:
            return y_first
        if z >= x_last:
            return y_last
        if z != z:
            return z
        i = bisect_right(xs, z) - 1
        return ys[i] + slopes[i] * (z - xs[i])

    return transform


def _compile_rule(node: Mapping[str, Any]) -> FiresFn:
    i = SIGNAL_INDEX[node["signal"]]
    v = node["value"]
    op = node["op"]
    if op == "<=":
        return lambda s, age: s[i] <= v
    if op == "<":
        return lambda s, age: s[i] < v
    if op == ">=":
        return lambda s, age: s[i] >= v
    return lambda s, age: s[i] > v


def _compile_gate_node(node: Mapping[str, Any]) -> FiresFn:
    if "any" in node or "all" in node:
        is_any = "any" in node
        children = [_compile_gate_node(child) for child in node["any" if is_any else "all"]]
        if len(children) == 1:
            return children[0]
        if len(children) == 2:
            first, second = children
            if is_any:
                return lambda s, age: first(s, age) or second(s, age)
            return lambda s, age: first(s, age) and second(s, age)
        if is_any:
            return lambda s, age: any(child(s, age) for child in children)
        return lambda s, age: all(child(s, age) for child in children)
    return _compile_rule(node)


def _compile_score(policy: Mapping[str, Any]) -> FiresFn:
    terms = []
    for term in policy["terms"]:
        factor = term["orientation"] / term["scale"]
        transform = knot_transform(term["knots"]) if "knots" in term else None
        terms.append((SIGNAL_INDEX[term["signal"]], term["mean"], factor, term["weight"], transform))
    threshold = policy["threshold"]

    def fires(s: list[float], age: int) -> bool:
        total = 0.0
        for index, mean, factor, weight, transform in terms:
            value = s[index]
            if value != value:  # missing signal: the term contributes 0
                continue
            z = (value - mean) * factor
            if transform is not None:
                z = transform(z)
            total += weight * z
        return total >= threshold

    return fires


def compile_policy(policy: Mapping[str, Any]) -> FiresFn:
    """Compile a validated policy object into ``fires(signals, age) -> bool``."""
    kind = policy["kind"]
    if kind == "periodic":
        interval = policy["interval"]
        return lambda s, age: age >= interval
    if kind == "gate":
        return _compile_gate_node({key: policy[key] for key in ("any", "all") if key in policy})
    return _compile_score(policy)


def policy_signals(policy: Mapping[str, Any]) -> frozenset[str]:
    """Names of the signals a validated policy reads."""
    if policy["kind"] == "periodic":
        return frozenset()
    if policy["kind"] == "score":
        return frozenset(term["signal"] for term in policy["terms"])
    found: set[str] = set()
    stack = [policy]
    while stack:
        node = stack.pop()
        if "signal" in node:
            found.add(node["signal"])
        for key in ("any", "all"):
            stack.extend(node.get(key, ()))
    return frozenset(found)


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
        self.policy_kind: str = data["policy"]["kind"]
        self.signals_used: frozenset[str] = policy_signals(data["policy"])
        self._fires: FiresFn = compile_policy(data["policy"])

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
