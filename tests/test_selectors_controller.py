"""Every registered scorer is a valid ``cache.scorer`` for the validator, the JSON schema and conformance vectors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rift_ada.conformance import check_output, random_controller_dict, run_vectors, vectors_text
from rift_ada.controller import Controller, ControllerError, validate_controller_dict
from rift_ada.controller_schema import schema_text
from rift_ada.scorers.registry import SCORER_NAMES


def _with_scorer(name: str) -> dict:
    controller = copy.deepcopy(random_controller_dict(3))
    controller["cache"]["scorer"] = name
    return controller


@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_every_scorer_passes_validator_schema_and_conformance(scorer: str, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    controller = _with_scorer(scorer)
    assert validate_controller_dict(controller)["cache"]["scorer"] == scorer
    jsonschema.Draft202012Validator(json.loads(schema_text())).validate(controller)
    vectors = tmp_path / "vectors.jsonl"
    vectors.write_text(vectors_text(controller, seed=5), encoding="utf-8")
    output = tmp_path / "output.jsonl"
    output.write_text(run_vectors(vectors), encoding="utf-8")
    assert check_output(vectors, output).ok
    assert (
        Controller.from_dict(json.loads(vectors.read_text().splitlines()[0])["controller"]).to_dict()["cache"]["scorer"]
        == scorer
    )


def test_an_unknown_scorer_is_refused_by_validator_and_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    controller = _with_scorer("snapkv-typo")
    with pytest.raises(ControllerError, match=r"cache\.scorer.*unknown scorer 'snapkv-typo'.*valid scorers: snapkv"):
        validate_controller_dict(controller)
    assert not jsonschema.Draft202012Validator(json.loads(schema_text())).is_valid(controller)


def test_bench_cells_of_another_scorer_are_not_read_back_and_default_cells_still_match() -> None:
    from rift_ada.calibrate.splits import CalibrationError
    from rift_ada.experiments.bench import _cell_fingerprint, bench_size, same_cell

    default = _cell_fingerprint(bench_size("tiny"), 0.0, 96, 0, "m", "d")
    assert "scorer" not in default["size"]  # cells written before scorers were selectable match
    older = {**default, "size": {name: value for name, value in default["size"].items()}}
    assert same_cell(older, default)
    other = _cell_fingerprint(bench_size("tiny", scorer="criticalkv"), 0.0, 96, 0, "m", "d")
    assert other["size"]["scorer"] == "criticalkv" and not same_cell(default, other)
    with pytest.raises(CalibrationError, match="scorer: unknown scorer 'nope'"):
        bench_size("tiny", scorer="nope")


def test_generated_selectors_section_survives_rewrites_of_the_results_page(tmp_path: Path) -> None:
    import importlib.util

    from rift_ada.experiments.bench_report import kept_sections

    spec = importlib.util.spec_from_file_location(
        "table2_selectors", Path(__file__).parents[1] / "benchmarks" / "table2_selectors.py"
    )
    table2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table2)
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nthe bench's part\n")
    result = {"command": "c", "model": "m", "requests": ["a", "b"], "isl_range": [1, 2], "output_tokens": 8,
              "draft_length": 3, "seed": 0, "resamples": 9, "cells": []}  # fmt: skip
    table2.write_section(page, table2.markdown({**result, "note": "first"}))
    table2.write_section(page, table2.markdown({**result, "note": "second"}))
    text = page.read_text()
    assert text.startswith("# Results\n\nthe bench's part\n") and "second" in text and "first" not in text
    (section,) = kept_sections(text)
    assert section.startswith(table2.BEGIN) and section.endswith(table2.END) and "second" in section
