"""Conformance vectors: Controller passes the committed ones, they regenerate byte for byte, and a
wrong port output is rejected naming the first differing round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.conformance import (
    ConformanceError,
    check_output,
    load_vectors,
    output_text,
    run_cases,
    run_vectors,
    vector_set,
)
from rift_ada.controller import SIGNAL_NAMES

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "data" / "conformance"
SHIPPED = sorted((ROOT / "data" / "controllers").glob("*.json"))
VECTOR_FILES = sorted(VECTORS.glob("*.jsonl"))


def _regenerate() -> dict[str, str]:
    manifest = json.loads((VECTORS / "manifest.json").read_text())
    return vector_set(
        SHIPPED,
        seed=manifest["seed"],
        n_random=sum(entry["file"].startswith("random-") for entry in manifest["files"]),
        n_cases=manifest["cases_per_file"],
        n_rounds=manifest["rounds_per_case"],
    )


def test_vectors_cover_every_shipped_controller_and_random_ones() -> None:
    names = {path.name for path in VECTOR_FILES}
    assert {f"{path.stem}.jsonl" for path in SHIPPED} <= names
    assert sum(name.startswith("random-") for name in names) >= 4


def test_vectors_carry_every_prefill_scorer() -> None:
    """An engine's controller loader meets each scorer of the schema in some vector's controller."""
    from rift_ada.scorers.registry import SCORER_NAMES

    scorers = {load_vectors(path)[1]["controller"]["cache"]["scorer"] for path in VECTOR_FILES}
    assert scorers == set(SCORER_NAMES)


def test_committed_vectors_regenerate_identically() -> None:
    """`rift-ada conformance write` is deterministic; if this fails after a change to Session's
    signals, regenerate with the command in data/conformance/manifest.json."""
    files = _regenerate()
    assert sorted(files) == sorted(path.name for path in VECTORS.iterdir())
    for name, text in files.items():
        assert (VECTORS / name).read_text() == text, f"{name} differs from a fresh `rift-ada conformance write`"


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda path: path.name)
def test_controller_passes_committed_vectors(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(run_vectors(path))
    result = check_output(path, out)
    assert result.ok, result.first_difference
    controller, _, rows = load_vectors(path)
    assert result.rounds_checked == len(rows) > 0
    decisions = [row["expected"] for row in rows if row["expected"]["decision"]]
    assert decisions, "vectors must contain decisions"
    if controller.policy_kind != "periodic" and controller.max_age > controller.min_age:
        assert any(d["refresh"] for d in decisions) and not all(d["refresh"] for d in decisions)


def test_vectors_exercise_every_signal_and_drift_input() -> None:
    seen_signals: set[str] = set()
    kinds = set()
    for path in VECTOR_FILES:
        _, _, rows = load_vectors(path)
        for row in rows:
            kinds.update(key for key in ("query_summary", "query_drift") if key in row)
            if row.get("query_drift", 0.0) is None:
                kinds.add("null drift")
            signals = row["expected"]["signals"] or {}
            seen_signals.update(name for name, value in signals.items() if value is not None)
    assert seen_signals == set(SIGNAL_NAMES)
    assert kinds == {"query_summary", "query_drift", "null drift"}


def _reference_rows(path: Path) -> list[dict]:
    controller, _, rows = load_vectors(path)
    return run_cases(controller, rows)


def test_wrong_refresh_is_rejected_naming_the_first_differing_round(tmp_path: Path) -> None:
    path = VECTORS / "random-00.jsonl"
    rows = _reference_rows(path)
    flipped = next(i for i, row in enumerate(rows) if row["decision"] and i > 10)
    rows[flipped]["refresh"] = not rows[flipped]["refresh"]
    rows[flipped + 5]["decision"] = not rows[flipped + 5]["decision"]  # a later error must not be the one named
    out = tmp_path / "port.jsonl"
    out.write_text(output_text(rows))
    result = check_output(path, out)
    assert not result.ok and result.rounds_checked == flipped
    wanted = f"case {rows[flipped]['case']} round {rows[flipped]['round']} "
    assert wanted in result.first_difference and "refresh: expected" in result.first_difference


def test_signal_beyond_tolerance_is_rejected_within_tolerance_accepted(tmp_path: Path) -> None:
    path = VECTORS / "random-01.jsonl"
    rows = _reference_rows(path)
    index = next(i for i, row in enumerate(rows) if row["decision"] and row["signals"]["acceptance"] is not None)
    out = tmp_path / "port.jsonl"
    rows[index]["signals"]["acceptance"] *= 1 + 1e-12
    out.write_text(output_text(rows))
    assert check_output(path, out).ok
    rows[index]["signals"]["acceptance"] += 1e-6
    out.write_text(output_text(rows))
    result = check_output(path, out)
    assert not result.ok and "signal acceptance" in result.first_difference
    rows[index]["signals"]["acceptance"] = None
    out.write_text(output_text(rows))
    assert "expected" in check_output(path, out).first_difference


def test_truncated_and_malformed_outputs(tmp_path: Path) -> None:
    path = VECTORS / "random-02.jsonl"
    rows = _reference_rows(path)
    out = tmp_path / "port.jsonl"
    out.write_text(output_text(rows[:-3]))
    result = check_output(path, out)
    assert not result.ok and "first missing" in result.first_difference
    out.write_text('{"format": "something-else", "version": 1}\n')
    with pytest.raises(ConformanceError, match="port.jsonl:1"):
        check_output(path, out)
    out.write_text(output_text(rows) + "{not json\n")
    with pytest.raises(ConformanceError, match=f"port.jsonl:{len(rows) + 2}: not valid JSON"):
        check_output(path, out)


def test_cli_write_run_check(tmp_path: Path) -> None:
    runner = CliRunner()
    out_dir = tmp_path / "vectors"
    result = runner.invoke(
        app, ["conformance", "write", *map(str, SHIPPED), "--out", str(out_dir), "--random", "1", "--rounds", "20"]
    )
    assert result.exit_code == 0, result.output
    vectors = out_dir / "random-00.jsonl"
    port = tmp_path / "port.jsonl"
    assert runner.invoke(app, ["conformance", "run", str(vectors), "--out", str(port)]).exit_code == 0
    result = runner.invoke(app, ["conformance", "check", str(vectors), str(port)])
    assert result.exit_code == 0 and "OK" in result.output
    lines = port.read_text().splitlines()
    row = json.loads(lines[5])
    row["decision"] = not row["decision"]
    lines[5] = json.dumps(row)
    port.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["conformance", "check", str(vectors), str(port)])
    assert result.exit_code == 1 and f"round {row['round']} " in " ".join(result.output.split())
    result = runner.invoke(app, ["conformance", "check", str(tmp_path / "missing.jsonl"), str(port)])
    assert result.exit_code == 1 and result.stdout == ""  # docs/cli.md: runtime errors on stderr, exit 1
    assert result.stderr.startswith("error: ") and "missing.jsonl: file not found" in "".join(result.stderr.split("\n"))
    assert "Traceback" not in result.stderr


def test_cli_json_and_errors(tmp_path: Path) -> None:
    """--json prints one JSON document on stdout; runtime errors are one line on stderr, exit 1;
    bad options exit 2 before any work."""
    runner = CliRunner()
    out_dir = tmp_path / "vectors"
    arguments = ["conformance", "write", str(SHIPPED[0]), "--out", str(out_dir), "--random", "0", "--rounds", "8"]
    result = runner.invoke(app, [*arguments, "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    assert written["files"] == sorted(p.name for p in out_dir.iterdir()) and "manifest.json" in written["files"]
    vectors = out_dir / f"{SHIPPED[0].stem}.jsonl"
    port = tmp_path / "port.jsonl"
    result = runner.invoke(app, ["conformance", "run", str(vectors), "--out", str(port), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rounds"] == len(port.read_text().splitlines()) - 1
    result = runner.invoke(app, ["conformance", "check", str(vectors), str(port), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["ok"] and report["first_difference"] is None
    port.write_text("\n".join(port.read_text().splitlines()[:-1]) + "\n")
    result = runner.invoke(app, ["conformance", "check", str(vectors), str(port), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and not report["ok"] and "first missing" in report["first_difference"]

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "rift-ada.controller", "version": 99}')
    result = runner.invoke(app, ["conformance", "write", str(bad), "--out", str(tmp_path / "x"), "--random", "0"])
    assert result.exit_code == 1 and result.stdout == "" and result.stderr.startswith("error: ")
    assert "bad.json" in result.stderr and "Traceback" not in result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(app, ["conformance", "run", str(vectors), "--out", str(blocker / "out.jsonl")])
    assert result.exit_code == 1 and "cannot write --out" in result.stderr
    result = runner.invoke(app, ["conformance", "write", "--cases", "0", "--out", str(tmp_path / "y")])
    assert result.exit_code == 2 and "--cases" in result.stderr and not (tmp_path / "y").exists()
