"""The controller JSON Schema (v1), built from the validator's own constants: the one source of both copies.

``rift_ada/schemas/controller-v1.json`` (package data) and ``docs/controller-schema.json`` are
written by ``python -m rift_ada.controller_schema --write``; a test checks that both equal
:func:`controller_schema` and that the schema and ``validate_controller_dict`` refuse the same
files. Standard library only, like :mod:`rift_ada.controller`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write_text
from rift_ada.controller import (
    _TOP_REQUIRED,
    CONTROLLER_FORMAT,
    CONTROLLER_VERSION,
    DEFAULT_CACHE,
    DEFAULT_SCHEDULE,
    MAX_CONTROLLER_BYTES,
    MAX_DEPTH,
    MAX_INTEGER,
    MAX_STRING_LENGTH,
    OPERATORS,
    SIGNAL_NAMES,
)
from rift_ada.scorers.registry import SCORER_NAMES

SCHEMA_ID = "https://rift-ada.invalid/schemas/controller-v1.json"
PACKAGE_COPY = Path(__file__).resolve().parent / "schemas" / "controller-v1.json"
DOCS_COPY = Path(__file__).resolve().parents[1] / "docs" / "controller-schema.json"

# Rules the validator applies that JSON Schema cannot express (documented in the schema itself).
VALIDATOR_ONLY_RULES = (
    "schedule.max_age >= schedule.min_age",
    "knot x strictly increasing and y non-decreasing",
    f"a nesting limit of {MAX_DEPTH} levels",
    f"integers in calibration of magnitude at most 2**{MAX_INTEGER.bit_length() - 1}",
    "integer fields are written without a fraction (8192, not 8192.0)",
    "no duplicate keys",
    f"files of at most {MAX_CONTROLLER_BYTES} bytes",
)


def _integer(minimum: int, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": MAX_INTEGER, **extra}


def _string(**extra: Any) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": MAX_STRING_LENGTH, **extra}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties) if required is None else required,
        "properties": properties,
    }


def _group(key: str) -> dict[str, Any]:
    return _object({key: {"$ref": "#/$defs/nodes"}})


def controller_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of controller JSON v1."""
    cache = {
        "budget": _integer(1, description="KV positions kept per KV head in each full-attention layer"),
        "sw_ratio": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "description": "share of the budget kept as the recent window",
        },
        "scorer": {
            "enum": list(SCORER_NAMES),
            "description": "prefill scorer of the selection (rift_ada.scorers.registry)",
        },
        "block_size": {
            "oneOf": [_integer(1), {"type": "null"}],
            "description": "block-level selection granularity; null = per position",
        },
        "obs_window": _integer(1),
    }
    assert list(cache) == list(DEFAULT_CACHE)
    schedule = {
        "decision_stride": _integer(1),
        "min_age": _integer(0),
        "max_age": _integer(0, description="must be >= min_age"),
    }
    assert list(schedule) == list(DEFAULT_SCHEDULE)
    number = {"type": "number"}
    knots = {
        "type": "array",
        "minItems": 2,
        "description": "[x, y] pairs of a monotone piecewise-linear map of the standardised value; "
        "x strictly increasing, y non-decreasing; clamped outside [x_first, x_last]",
        "items": {"type": "array", "prefixItems": [number, number], "minItems": 2, "maxItems": 2},
    }
    term = _object(
        {
            "signal": {"$ref": "#/$defs/signal"},
            "orientation": {"enum": [1, -1]},
            "mean": number,
            "scale": {"type": "number", "exclusiveMinimum": 0},
            "weight": {"type": "number", "minimum": 0},
            "knots": knots,
        },
        required=["signal", "orientation", "mean", "scale", "weight"],
    )
    gate = _object(
        {"kind": {"const": "gate"}, "any": {"$ref": "#/$defs/nodes"}, "all": {"$ref": "#/$defs/nodes"}},
        required=["kind"],
    )
    gate["oneOf"] = [{"required": ["any"]}, {"required": ["all"]}]
    json_value = {
        "type": ["null", "boolean", "number", "string", "array", "object"],
        "maxLength": MAX_STRING_LENGTH,
        "items": {"$ref": "#/$defs/json"},
        "propertyNames": {"maxLength": MAX_STRING_LENGTH},
        "additionalProperties": {"$ref": "#/$defs/json"},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"rift-ada controller, version {CONTROLLER_VERSION}",
        "description": (
            "A calibrated RIFT-ada refresh controller for one draft/target/temperature. Numbers must be finite "
            "(JSON has no NaN/Infinity; the loader also refuses the non-standard tokens). "
            "rift_ada.Controller.load applies exactly these rules, plus: " + ", ".join(VALIDATOR_ONLY_RULES) + ". "
            "Generated by `python -m rift_ada.controller_schema --write`; do not edit by hand."
        ),
        "type": "object",
        "additionalProperties": False,
        "required": list(_TOP_REQUIRED),  # the loader's own list
        "properties": {
            "format": {"const": CONTROLLER_FORMAT},
            "version": {"const": CONTROLLER_VERSION},
            "name": _string(),
            "draft": _string(description="draft model (Hub id or path)"),
            "target": _string(description="target model (Hub id or path)"),
            "temperature": {"type": "number", "minimum": 0},
            "cache": _object(cache),
            "schedule": _object(schedule),
            "signals": _object(
                {
                    "acceptance": _object(
                        {"ewma_alpha": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "rounds": _integer(1)}
                    )
                }
            ),
            "policy": {"oneOf": [{"$ref": "#/$defs/periodic"}, {"$ref": "#/$defs/gate"}, {"$ref": "#/$defs/score"}]},
            "calibration": {
                "type": "object",
                "description": "free-form provenance: trace manifest hash, splits, seed, trials, chosen trial, "
                "confirmation results",
                "propertyNames": {"maxLength": MAX_STRING_LENGTH},
                "additionalProperties": {"$ref": "#/$defs/json"},
            },
        },
        "$defs": {
            "signal": {"enum": list(SIGNAL_NAMES)},
            "rule": _object({"signal": {"$ref": "#/$defs/signal"}, "op": {"enum": list(OPERATORS)}, "value": number}),
            "nodes": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"}},
            "any": _group("any"),
            "all": _group("all"),
            "node": {"oneOf": [{"$ref": "#/$defs/rule"}, {"$ref": "#/$defs/any"}, {"$ref": "#/$defs/all"}]},
            "periodic": _object({"kind": {"const": "periodic"}, "interval": _integer(1)}),
            "gate": gate,
            "term": term,
            "score": _object(
                {
                    "kind": {"const": "score"},
                    "terms": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/term"}},
                    "threshold": number,
                }
            ),
            "json": json_value,
        },
    }


def schema_text() -> str:
    """The schema as written to both copies (2-space indent, trailing newline)."""
    return json.dumps(controller_schema(), indent=2, ensure_ascii=False) + "\n"


def write_copies() -> list[Path]:
    """Write the package and docs copies; returns their paths."""
    text = schema_text()
    for path in (PACKAGE_COPY, DOCS_COPY):
        atomic_write_text(path, text)
    return [PACKAGE_COPY, DOCS_COPY]


if __name__ == "__main__":
    if "--write" in sys.argv:
        for written in write_copies():
            print(f"wrote {written}")
    else:
        print(schema_text(), end="")
