"""Controller JSON v1 validation: malformed input always raises ControllerError naming the field."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rift_ada import Controller, ControllerError

ROOT = Path(__file__).resolve().parents[1]

DESIGN_EXAMPLE: dict[str, Any] = {
    "format": "rift-ada.controller",
    "version": 1,
    "name": "qwen35-4b-T1",
    "draft": "Qwen/Qwen3.5-4B",
    "target": "Qwen/Qwen3.5-122B-A10B",
    "temperature": 1.0,
    "cache": {"budget": 8192, "sw_ratio": 0.5, "scorer": "snapkv", "block_size": 128, "obs_window": 64},
    "schedule": {"decision_stride": 8, "min_age": 32, "max_age": 768},
    "signals": {"acceptance": {"ewma_alpha": 0.4, "rounds": 4}},
    "policy": {
        "kind": "gate",
        "any": [
            {"signal": "acceptance", "op": "<=", "value": 5.1},
            {
                "all": [
                    {"signal": "entropy", "op": ">=", "value": 1.7},
                    {"signal": "query_drift", "op": ">=", "value": 0.08},
                ]
            },
        ],
    },
    "calibration": {
        "manifest_sha256": "abc",
        "splits": [0.4, 0.3, 0.3],
        "seed": 0,
        "trials": 200,
        "confirmation": {"refresh_reduction": {"estimate": 0.5, "ci95": [0.4, 0.6]}},
    },
}

SCORE_POLICY = {
    "kind": "score",
    "terms": [
        {
            "signal": "entropy",
            "orientation": 1,
            "mean": 1.0,
            "scale": 0.5,
            "weight": 1.0,
            "knots": [[-1.0, -1.0], [0.0, 0.0], [2.0, 0.5]],
        },
        {"signal": "acceptance_drop", "orientation": -1, "mean": 0.0, "scale": 1.0, "weight": 0.0},
    ],
    "threshold": 0.2,
}
PERIODIC_POLICY = {"kind": "periodic", "interval": 64}


def valid_examples() -> list[dict[str, Any]]:
    score = copy.deepcopy(DESIGN_EXAMPLE)
    score["policy"] = copy.deepcopy(SCORE_POLICY)
    score["cache"]["block_size"] = None
    periodic = copy.deepcopy(DESIGN_EXAMPLE)
    periodic["policy"] = copy.deepcopy(PERIODIC_POLICY)
    del periodic["calibration"]
    return [copy.deepcopy(DESIGN_EXAMPLE), score, periodic]


def walk(value: Any, path: str = "", parts: tuple = ()) -> list[tuple[str, tuple, Any]]:
    """(field path as the validator writes it, key path, value) of every node below the root."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            found.append((child, parts + (key,), item))
            found.extend(walk(item, child, parts + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            child = f"{path}[{index}]"
            found.append((child, parts + (index,), item))
            found.extend(walk(item, child, parts + (index,)))
    return found


def set_at(data: Any, parts: tuple, value: Any) -> None:
    for part in parts[:-1]:
        data = data[part]
    data[parts[-1]] = value


def delete_at(data: Any, parts: tuple) -> None:
    for part in parts[:-1]:
        data = data[part]
    del data[parts[-1]]


def in_free_form(path: str) -> bool:
    return path.startswith("calibration.") or path.startswith("calibration[")


def under(field: str, path: str) -> bool:
    return field == path or field.startswith(path + ".") or field.startswith(path + "[")


def raises_controller_error(data: Any) -> ControllerError:
    try:
        Controller.from_dict(data)
    except ControllerError as exc:
        assert str(exc).startswith(f"{exc.field}: ")
        return exc
    raise AssertionError("accepted an invalid controller")


def test_valid_examples_load_and_round_trip(tmp_path: Path) -> None:
    for data in valid_examples():
        ctl = Controller.from_dict(data)
        assert ctl.to_dict() == data
        path = tmp_path / "controller.json"
        path.write_text(json.dumps(data))
        assert Controller.load(path).to_dict() == data
        assert Controller.from_dict(ctl.to_dict()).to_dict() == data


UNIVERSALLY_INVALID = [True, False, [1], {}, float("nan"), float("inf"), -float("inf"), [], {"zz": 1}]


@settings(max_examples=300, deadline=None)
@given(example=st.integers(0, 2), choice=st.integers(0, 10_000), bad=st.sampled_from(UNIVERSALLY_INVALID))
def test_wrong_values_name_their_field(example: int, choice: int, bad: Any) -> None:
    data = valid_examples()[example]
    nodes = [(path, parts, value) for path, parts, value in walk(data) if not in_free_form(path)]
    path, parts, _ = nodes[choice % len(nodes)]
    if path == "calibration" and isinstance(bad, dict):
        return  # any object is valid provenance
    set_at(data, parts, copy.deepcopy(bad))
    error = raises_controller_error(data)
    if path.endswith(".kind") or path == "format" or path == "version":
        assert error.field.startswith(path.rsplit(".", 1)[0] if "." in path else path)
    else:
        assert under(error.field, path), (path, error.field, str(error))


@settings(max_examples=200, deadline=None)
@given(example=st.integers(0, 2), choice=st.integers(0, 10_000))
def test_missing_required_fields_are_named(example: int, choice: int) -> None:
    data = valid_examples()[example]
    keys = [
        (path, parts)
        for path, parts, _ in walk(data)
        if isinstance(parts[-1], str) and not in_free_form(path) and parts[-1] not in ("knots", "calibration")
    ]
    path, parts = keys[choice % len(keys)]
    delete_at(data, parts)
    error = raises_controller_error(data)
    if parts[-1] in ("any", "all") and len(parts) > 2:
        # An emptied group node reads as a rule with its fields missing.
        assert under(error.field, path.rsplit(".", 1)[0]), (path, str(error))
    else:
        assert error.field == path, (path, str(error))


@settings(max_examples=200, deadline=None)
@given(
    example=st.integers(0, 2),
    choice=st.integers(0, 10_000),
    key=st.sampled_from(["zz_unknown", "", "Budget", "policy ", "0"]),
)
def test_unknown_keys_are_refused(example: int, choice: int, key: str) -> None:
    data = valid_examples()[example]
    objects = [("", ())] + [
        (path, parts)
        for path, parts, value in walk(data)
        if isinstance(value, dict) and not path.startswith("calibration")
    ]
    path, parts = objects[choice % len(objects)]
    target = data
    for part in parts:
        target = target[part]
    target[key] = 1
    error = raises_controller_error(data)
    assert error.field == (f"{path}.{key}" if path else key)
    assert "unknown key" in str(error)


@settings(max_examples=200, deadline=None)
@given(
    example=st.integers(0, 2),
    choice=st.integers(0, 10_000),
    bad=st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**400, -(10**400)]),
)
def test_non_finite_numbers_are_refused(example: int, choice: int, bad: Any) -> None:
    data = valid_examples()[example]
    numbers = [
        (path, parts)
        for path, parts, value in walk(data)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    path, parts = numbers[choice % len(numbers)]
    set_at(data, parts, bad)
    try:
        Controller.from_dict(data)
    except ControllerError as error:
        assert under(error.field, path) or path in ("version",), (path, str(error))
    else:
        # Only provenance may hold a huge integer (integer fields are capped at 2**53).
        assert isinstance(bad, int) and path.startswith("calibration")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("format",), "rift-ada.traces", "format"),
        (("version",), 2, "version"),
        (("version",), True, "version"),
        (("version",), 1.0, "version"),
        (("temperature",), -0.5, "temperature"),
        (("temperature",), "1", "temperature"),
        (("cache", "budget"), 0, "cache.budget"),
        (("cache", "budget"), 8192.0, "cache.budget"),
        (("cache", "budget"), True, "cache.budget"),
        (("cache", "sw_ratio"), 0.0, "cache.sw_ratio"),
        (("cache", "sw_ratio"), 1.5, "cache.sw_ratio"),
        (("cache", "block_size"), 0, "cache.block_size"),
        (("cache", "obs_window"), 0, "cache.obs_window"),
        (("cache", "scorer"), 3, "cache.scorer"),
        (("schedule", "decision_stride"), 0, "schedule.decision_stride"),
        (("schedule", "min_age"), -1, "schedule.min_age"),
        (("schedule", "max_age"), -8, "schedule.max_age"),
        (("schedule", "max_age"), 16, "schedule.max_age"),
        (("signals", "acceptance", "ewma_alpha"), 0.0, "signals.acceptance.ewma_alpha"),
        (("signals", "acceptance", "ewma_alpha"), 1.2, "signals.acceptance.ewma_alpha"),
        (("signals", "acceptance", "rounds"), 0, "signals.acceptance.rounds"),
        (("policy", "kind"), "magic", "policy.kind"),
        (("policy", "any", 1, "all", 0, "op"), "==", "policy.any[1].all[0].op"),
        (("policy", "any", 1, "all", 0, "op"), "=>", "policy.any[1].all[0].op"),
        (("policy", "any", 1, "all", 1, "signal"), "retained_mass", "policy.any[1].all[1].signal"),
        (("policy", "any", 0, "value"), "5", "policy.any[0].value"),
        (("policy", "any", 0, "value"), False, "policy.any[0].value"),
        (("policy", "any", 1, "all"), [], "policy.any[1].all"),
        (("policy", "any"), [], "policy.any"),
    ],
)
def test_specific_errors(path: tuple, value: Any, field: str) -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    set_at(data, path, value)
    error = raises_controller_error(data)
    assert error.field == field, str(error)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p["terms"][0].update(orientation=0), "policy.terms[0].orientation"),
        (lambda p: p["terms"][0].update(orientation=True), "policy.terms[0].orientation"),
        (lambda p: p["terms"][0].update(scale=0.0), "policy.terms[0].scale"),
        (lambda p: p["terms"][0].update(weight=-0.1), "policy.terms[0].weight"),
        (lambda p: p["terms"][0].update(signal="entropy_drop"), "policy.terms[0].signal"),
        (lambda p: p["terms"][0].update(knots=[[0.0, 0.0]]), "policy.terms[0].knots"),
        (lambda p: p["terms"][0].update(knots=[[0.0, 0.0], [0.0, 1.0]]), "policy.terms[0].knots[1][0]"),
        (lambda p: p["terms"][0].update(knots=[[0.0, 1.0], [1.0, 0.5]]), "policy.terms[0].knots[1][1]"),
        (lambda p: p["terms"][0].update(knots=[[0.0, 1.0, 2.0], [1.0, 0.5]]), "policy.terms[0].knots[0]"),
        (lambda p: p.update(terms=[]), "policy.terms"),
        (lambda p: p.update(threshold=None), "policy.threshold"),
    ],
)
def test_score_errors(mutate: Any, field: str) -> None:
    data = valid_examples()[1]
    mutate(data["policy"])
    assert raises_controller_error(data).field == field


def test_gate_shape_errors() -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["policy"]["all"] = [{"signal": "entropy", "op": ">", "value": 1.0}]
    assert raises_controller_error(data).field == "policy"
    data = copy.deepcopy(DESIGN_EXAMPLE)
    del data["policy"]["any"]
    assert raises_controller_error(data).field == "policy.any"
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["policy"]["any"][1]["any"] = []
    assert raises_controller_error(data).field == "policy.any[1]"
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["policy"] = {"kind": "periodic", "interval": 0}
    assert raises_controller_error(data).field == "policy.interval"


@pytest.mark.parametrize("depth", [40, 5000])
def test_deep_nesting_is_refused(depth: int) -> None:
    node: dict[str, Any] = {"signal": "entropy", "op": ">", "value": 1.0}
    for _ in range(depth):
        node = {"any": [node]}
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["policy"] = {"kind": "gate", **node}
    error = raises_controller_error(data)
    assert error.field.startswith("policy.any[0]") and "nesting" in str(error)
    deep: Any = 1
    for _ in range(depth):
        deep = [deep]
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["calibration"] = {"deep": deep}
    assert raises_controller_error(data).field.startswith("calibration.deep")


def test_nesting_within_the_limit_is_fine() -> None:
    node: dict[str, Any] = {"signal": "entropy", "op": ">", "value": 1.0}
    for _ in range(20):
        node = {"all": [node]}
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["policy"] = {"kind": "gate", **node}
    assert Controller.from_dict(data).policy_kind == "gate"


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.sampled_from(["rift-ada.controller", "gate", "score", "periodic", "<=", "entropy"]),
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "format",
                    "version",
                    "name",
                    "policy",
                    "kind",
                    "any",
                    "all",
                    "signal",
                    "op",
                    "value",
                    "terms",
                    "cache",
                    "schedule",
                    "x",
                ]
            )
            | st.text(max_size=4),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_arbitrary_json_raises_only_controller_error(value: Any) -> None:
    with pytest.raises(ControllerError):
        Controller.from_dict(value)


@settings(max_examples=200, deadline=None)
@given(section=st.sampled_from(["cache", "schedule", "signals", "policy", "calibration"]), value=json_values)
def test_arbitrary_sections_raise_only_controller_error(section: str, value: Any) -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data[section] = value
    try:
        Controller.from_dict(data)
    except ControllerError as error:
        assert under(error.field, section)
    else:
        assert section == "calibration"  # free-form provenance accepts any finite JSON object


def test_non_string_keys_are_refused() -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["cache"][3] = 1
    assert raises_controller_error(data).field == "cache"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ControllerError) as info:
        Controller.load(missing)
    assert str(missing) in str(info.value)
    for name, text in [
        ("broken.json", "{not json"),
        ("empty.json", ""),
        ("deep.json", "[" * 100_000 + "]" * 100_000),
        ("dupe.json", '{"format": "a", "format": "b"}'),
        ("binary.json", None),
    ]:
        path = tmp_path / name
        if text is None:
            path.write_bytes(b"\xff\xfe\x00garbage")
        else:
            path.write_text(text)
        with pytest.raises(ControllerError) as info:
            Controller.load(path)
        assert info.value.field == str(path), name
    path = tmp_path / "directory.json"
    path.mkdir()
    with pytest.raises(ControllerError):
        Controller.load(path)


def test_nan_literals_in_files_are_refused_with_the_field(tmp_path: Path) -> None:
    for token in ("NaN", "Infinity", "-Infinity", "1e999"):
        path = tmp_path / "controller.json"
        path.write_text(json.dumps(DESIGN_EXAMPLE).replace('"value": 5.1', f'"value": {token}'))
        with pytest.raises(ControllerError) as info:
            Controller.load(path)
        assert info.value.field == "policy.any[0].value"
        assert str(path) in str(info.value)


def test_schema_copies_are_identical_and_cover_the_contract() -> None:
    package = (ROOT / "rift_ada" / "schemas" / "controller-v1.json").read_text()
    docs = (ROOT / "docs" / "controller-schema.json").read_text()
    assert package == docs
    schema = json.loads(package)
    assert schema["properties"]["format"] == {"const": "rift-ada.controller"}
    assert set(schema["required"]) == {
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
    }
    assert schema["$defs"]["signal"]["enum"] == [
        "acceptance",
        "entropy",
        "query_drift",
        "acceptance_drop",
        "entropy_rise",
    ]
    assert schema["$defs"]["rule"]["properties"]["op"]["enum"] == ["<=", "<", ">=", ">"]


def test_schema_accepts_the_examples_when_jsonschema_is_available() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "rift_ada" / "schemas" / "controller-v1.json").read_text())
    for data in valid_examples():
        jsonschema.validate(data, schema)


def test_numbers_are_normalised() -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["temperature"] = 1
    data["policy"]["any"][0]["value"] = 5
    out = Controller.from_dict(data).to_dict()
    assert isinstance(out["temperature"], float) and isinstance(out["policy"]["any"][0]["value"], float)
    assert not math.isnan(out["temperature"])
