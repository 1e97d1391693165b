"""Field checks of controller JSON: each returns the normalised value or raises :class:`ControllerError`
naming the field path. Shared by :mod:`rift_ada.controller` and the policy kinds
(:mod:`rift_ada.policy_kinds`). Standard library only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SIGNAL_NAMES: tuple[str, ...] = ("acceptance", "entropy", "query_drift", "acceptance_drop", "entropy_rise")
SIGNAL_INDEX: dict[str, int] = {name: index for index, name in enumerate(SIGNAL_NAMES)}
OPERATORS: tuple[str, ...] = ("<=", "<", ">=", ">")
MAX_DEPTH = 32
MAX_INTEGER = 2**53  # integer fields stay exact in JSON doubles and fit int64 arrays
MAX_STRING_LENGTH = 4096  # characters in any string (names, model ids, provenance values and keys)
_MAX_INTEGER_DIGITS = 20  # longer integer literals are never parsed into ints (no 5,000-digit parses)

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
