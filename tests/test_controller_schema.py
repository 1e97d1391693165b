"""The JSON Schema is generated from one source, and it refuses the same controller files as the validator."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_controller_validation import delete_at, in_free_form, set_at, valid_examples, walk

from rift_ada.controller import MAX_DEPTH, MAX_STRING_LENGTH, ControllerError, validate_controller_dict
from rift_ada.controller_schema import DOCS_COPY, PACKAGE_COPY, VALIDATOR_ONLY_RULES, schema_text

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_VALIDATOR = jsonschema.Draft202012Validator(json.loads(schema_text()))

# Replacement values tried at every field outside the free-form provenance.
BAD_VALUES: list[Any] = [True, None, "x", "", [], [1], {}, {"zz": 1}, -1, 0, 0.5, 1.5, 10**17, "s" * 5000]


# How the validator words the rules of VALIDATOR_ONLY_RULES that a mutation can hit.
VALIDATOR_ONLY_PROBLEMS = (
    "must be >= schedule.min_age",
    "knot x values must be strictly increasing",
    "knot y values must be non-decreasing",
    "nesting deeper than",
    "integer out of range",
    "expected an integer, got a number",
)


def validator_error(data: Any) -> ControllerError | None:
    try:
        validate_controller_dict(data)
    except ControllerError as error:
        return error
    return None


def validator_refuses(data: Any) -> bool:
    return validator_error(data) is not None


def schema_refuses(data: Any) -> bool:
    return any(True for _ in SCHEMA_VALIDATOR.iter_errors(data))


def _mutations() -> Iterator[tuple[str, Any]]:
    """(description, controller as parsed from a JSON file) for every single-field change of the examples."""
    for number, example in enumerate(valid_examples()):
        yield f"example {number}", example
        nodes = list(walk(example))
        for path, parts, _ in nodes:
            if in_free_form(path):
                continue
            for bad in BAD_VALUES:
                data = copy.deepcopy(example)
                set_at(data, parts, copy.deepcopy(bad))
                yield f"example {number}: {path} = {str(bad)[:20]}", data
            if isinstance(parts[-1], str):
                data = copy.deepcopy(example)
                delete_at(data, parts)
                yield f"example {number}: del {path}", data
        for path, parts, value in [("", (), example), *nodes]:
            if isinstance(value, dict) and not in_free_form(path):
                data = copy.deepcopy(example)
                target = data
                for part in parts:
                    target = target[part]
                target["zz_unknown"] = 1
                yield f"example {number}: unknown key in {path or 'root'}", data
    base = valid_examples()[0]
    for label, value in (("long key", {"k" * (MAX_STRING_LENGTH + 1): 1}), ("long string", {"v": "s" * 5000}),
                         ("nested list", {"v": [[1, "ok"], {"x": None}]})):  # fmt: skip
        data = copy.deepcopy(base)
        data["calibration"] = value
        yield f"calibration {label}", data


def _validator_only() -> Iterator[tuple[str, str, Any]]:
    """(rule, description, controller) refused by the validator only: each rule listed in the schema's text."""
    base = valid_examples()
    data = copy.deepcopy(base[0])
    data["schedule"]["min_age"], data["schedule"]["max_age"] = 64, 32
    yield "schedule.max_age >= schedule.min_age", "max_age < min_age", data
    data = copy.deepcopy(base[1])
    data["policy"]["terms"][0]["knots"] = [[0.0, 0.0], [0.0, 1.0]]
    yield "knot x strictly increasing", "repeated knot x", data
    data = copy.deepcopy(base[1])
    data["policy"]["terms"][0]["knots"] = [[0.0, 1.0], [1.0, 0.0]]
    yield "y non-decreasing", "decreasing knot y", data
    data = copy.deepcopy(base[0])
    node: dict[str, Any] = {"signal": "entropy", "op": ">=", "value": 1.0}
    for _ in range(MAX_DEPTH + 1):
        node = {"any": [node]}
    data["policy"] = {"kind": "gate", **node}
    yield f"nesting limit of {MAX_DEPTH} levels", "deep gate", data
    data = copy.deepcopy(base[0])
    data["calibration"]["seed"] = 2**60
    yield "integers in calibration", "huge calibration integer", data
    data = copy.deepcopy(base[0])
    data["cache"]["budget"] = 8192.0
    yield "integer fields are written without a fraction", "8192.0 as a budget", data


def test_schema_copies_equal_the_generated_schema() -> None:
    text = schema_text()
    assert PACKAGE_COPY.read_text(encoding="utf-8") == text, "run python -m rift_ada.controller_schema --write"
    assert DOCS_COPY.read_text(encoding="utf-8") == text
    assert PACKAGE_COPY == ROOT / "rift_ada" / "schemas" / "controller-v1.json"
    assert DOCS_COPY == ROOT / "docs" / "controller-schema.json"


def test_schema_and_validator_refuse_the_same_files() -> None:
    corpus = list(_mutations())
    assert len(corpus) > 500
    disagreements = []
    refused = validator_only = 0
    for description, data in corpus:
        data = json.loads(json.dumps(data))  # exactly what a file holds
        error, by_schema = validator_error(data), schema_refuses(data)
        refused += error is not None
        if error is not None and not by_schema and any(p in error.problem for p in VALIDATOR_ONLY_PROBLEMS):
            validator_only += 1  # a rule the schema documents but cannot express
        elif (error is not None) != by_schema:
            disagreements.append((description, str(error)[:80], by_schema))
    assert not disagreements, disagreements[:20]
    assert refused > 0.8 * len(corpus)  # the corpus is mostly invalid files, not a trivially valid one
    assert validator_only < 0.05 * len(corpus)


def test_rules_the_schema_cannot_express_are_listed_and_enforced() -> None:
    for rule, description, data in _validator_only():
        data = json.loads(json.dumps(data))
        assert validator_refuses(data), description
        assert not schema_refuses(data), description
        assert any(rule in listed for listed in VALIDATOR_ONLY_RULES), rule
        assert rule in json.loads(schema_text())["description"]
