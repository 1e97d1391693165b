"""Conformance vectors: prove that a port of `rift_ada.Controller` (C++, Rust, CUDA host code) decides alike.

A vectors file is JSONL. Line 1 is a header holding the controller dict; every further line is one
verification round of one case (a request from its prefill on) with its inputs and the expected
output of `rift_ada.Controller`::

    {"case": 0, "round": 5, "accepted_len": 4, "entropies": [...], "n_committed": 31,
     "query_summary": [[[...]]]  (optional), "query_drift": 0.07 or null (optional),
     "expected": {"decision": true, "refresh": false, "signals": {"acceptance": 5.2, ...}}}

A port replays each round as ``record_round(accepted_len, entropies)``; then
``record_queries(query_summary)`` if the key is present; then ``record_query_drift(query_drift)``
if that key is present (null = NaN); then ``decide(n_committed)``. It writes one output line per
round, ``{"case", "round", "decision", "refresh", "signals"}`` (signals null when no decision
happened, a missing signal as null), and `check_output` compares it with the expected values.

Standard library only. Generation is deterministic: the same seed gives byte-identical files.
The format is documented in docs/serving.md.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift_ada.controller import SIGNAL_NAMES, Controller, Session, make_controller_dict
from rift_ada.scorers.registry import SCORER_NAMES

__all__ = [
    "OUTPUT_FORMAT",
    "VECTOR_FORMAT",
    "VECTOR_VERSION",
    "CheckResult",
    "ConformanceError",
    "check_output",
    "generate_cases",
    "load_output",
    "load_vectors",
    "output_text",
    "random_controller_dict",
    "run_cases",
    "run_vectors",
    "vector_set",
    "vectors_text",
]

VECTOR_FORMAT = "rift-ada.conformance"
OUTPUT_FORMAT = "rift-ada.conformance-output"
VECTOR_VERSION = 1
DRAFT_LENGTH = 11  # K: a round accepts 0..K drafts
SIGNAL_ATOL = 1e-9
SIGNAL_RTOL = 1e-9
CASE_MODES = ("summaries", "drift", "no-drift", "float-al")
_SIGNAL_RANGES: dict[str, tuple[float, float]] = {
    "acceptance": (2.0, 10.0),
    "entropy": (0.5, 3.0),
    "query_drift": (0.0, 0.3),
    "acceptance_drop": (-1.0, 4.0),
    "entropy_rise": (-0.5, 1.5),
}
_SUMMARY_SHAPE = (2, 2, 4)  # layers, KV groups, head dim of the synthetic query summaries


class ConformanceError(ValueError):
    """A vectors or output file is malformed (names the file and line)."""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _r(value: float) -> float:
    return round(value, 4)


# ----------------------------------------------------------------------------------------------
# Random controllers


def _random_rule(rng: random.Random) -> dict[str, Any]:
    signal = rng.choice(SIGNAL_NAMES)
    low, high = _SIGNAL_RANGES[signal]
    return {"signal": signal, "op": rng.choice(("<=", "<", ">=", ">")), "value": _r(rng.uniform(low, high))}


def _random_gate_node(rng: random.Random, depth: int) -> dict[str, Any]:
    if depth >= 2 or rng.random() < 0.5:
        return _random_rule(rng)
    key = rng.choice(("any", "all"))
    return {key: [_random_gate_node(rng, depth + 1) for _ in range(rng.randint(1, 3))]}


def _random_score(rng: random.Random) -> dict[str, Any]:
    terms = []
    for signal in rng.sample(SIGNAL_NAMES, rng.randint(1, len(SIGNAL_NAMES))):
        low, high = _SIGNAL_RANGES[signal]
        term: dict[str, Any] = {
            "signal": signal,
            "orientation": rng.choice((1, -1)),
            "mean": _r(rng.uniform(low, high)),
            "scale": _r(rng.uniform(0.2, 3.0)),
            "weight": _r(rng.uniform(0.0, 2.0)),
        }
        if rng.random() < 0.5:
            xs = sorted({_r(rng.uniform(-2.0, 2.0)) for _ in range(3)})
            ys = sorted(_r(rng.uniform(-1.0, 1.0)) for _ in xs)
            if len(xs) >= 2:
                term["knots"] = [[x, y] for x, y in zip(xs, ys, strict=True)]
        terms.append(term)
    return {"kind": "score", "terms": terms, "threshold": _r(rng.uniform(-1.0, 2.0))}


def _random_periodic(rng: random.Random) -> dict[str, Any]:
    return {"kind": "periodic", "interval": rng.randint(4, 256)}


def _random_gate(rng: random.Random) -> dict[str, Any]:
    return {"kind": "gate", rng.choice(("any", "all")): [_random_gate_node(rng, 1) for _ in range(3)]}


# A random policy per kind, and the mix of kinds drawn (the shipped vectors were generated with it:
# a kind added later joins the mix only with regenerated vectors).
_RANDOM_POLICIES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "periodic": _random_periodic,
    "gate": _random_gate,
    "score": _random_score,
}
_RANDOM_KIND_MIX = ("gate", "gate", "score", "score", "periodic")


def random_controller_dict(seed: int) -> dict[str, Any]:
    """A valid controller with a random policy (gate, score or periodic), schedule and EWMA."""
    rng = random.Random(seed)
    policy = _RANDOM_POLICIES[rng.choice(_RANDOM_KIND_MIX)](rng)
    min_age = rng.choice((0, 8, 16, 32, 64))
    return make_controller_dict(
        policy,
        name=f"random-{seed}",
        draft="conformance/draft",
        target="conformance/target",
        temperature=rng.choice((0.0, 1.0)),
        schedule={
            "decision_stride": rng.choice((1, 4, 8, 16)),
            "min_age": min_age,
            "max_age": min_age + rng.choice((32, 128, 384, 768)),
        },
        signals={"acceptance": {"ewma_alpha": _r(rng.uniform(0.1, 1.0)), "rounds": rng.randint(1, 6)}},
        # every prefill scorer appears across the random controllers (by seed, not drawn: the draws above stay
        # as they were); decisions do not depend on it, the engine's selection does
        cache={"scorer": SCORER_NAMES[seed % len(SCORER_NAMES)]},
        calibration={"note": f"random controller for conformance vectors, seed {seed}"},
    )


# ----------------------------------------------------------------------------------------------
# Cases (inputs only)


def _unit_noise(rng: random.Random, scale: float) -> list[list[list[float]]]:
    layers, groups, dim = _SUMMARY_SHAPE
    return [[[rng.gauss(0.0, scale) for _ in range(dim)] for _ in range(groups)] for _ in range(layers)]


def _generate_case(rng: random.Random, mode: str, n_rounds: int, stride: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    n_committed = 0
    base = _unit_noise(rng, 1.0)
    wander = 0.0
    phase_left = 0
    mean_accepted = entropy_level = 0.0
    for index in range(n_rounds):
        if phase_left == 0:  # regime switches make signals cross thresholds both ways
            phase_left = rng.randint(4, 24)
            mean_accepted = rng.uniform(0.0, DRAFT_LENGTH)
            entropy_level = rng.uniform(0.1, 3.5)
        phase_left -= 1
        accepted = min(DRAFT_LENGTH, max(0, round(rng.gauss(mean_accepted, 1.5))))
        count = min(DRAFT_LENGTH, accepted + 1) if rng.random() > 0.05 else 0
        entropies = [_r(max(0.0, rng.gauss(entropy_level, 0.4))) for _ in range(count)]
        if mode == "float-al":
            accepted_len: float = _r(min(DRAFT_LENGTH + 1.0, max(1.0, rng.gauss(mean_accepted + 1.0, 1.2))))
            step = max(1, round(accepted_len))
        else:
            accepted_len = accepted + 1
            step = accepted + 1
        before = n_committed
        n_committed += step
        row: dict[str, Any] = {
            "case": -1,
            "round": index,
            "accepted_len": accepted_len,
            "entropies": entropies,
            "n_committed": n_committed,
        }
        boundary = n_committed // stride > before // stride
        if mode == "summaries" and (boundary or rng.random() < 0.1) and rng.random() < 0.9:
            wander += rng.uniform(0.0, 0.15)
            noise = _unit_noise(rng, wander)
            row["query_summary"] = [
                [[_r(b + n) for b, n in zip(vb, vn, strict=True)] for vb, vn in zip(lb, ln, strict=True)]
                for lb, ln in zip(base, noise, strict=True)
            ]
        elif mode == "drift" and boundary and rng.random() < 0.85:
            row["query_drift"] = None if rng.random() < 0.1 else _r(rng.uniform(0.0, 0.3))
        rows.append(row)
    return rows


def generate_cases(controller: Controller, seed: int, n_cases: int = 4, n_rounds: int = 96) -> list[dict[str, Any]]:
    """Input rows of ``n_cases`` cases (modes cycle through CASE_MODES), deterministic in ``seed``."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for case in range(n_cases):
        for row in _generate_case(rng, CASE_MODES[case % len(CASE_MODES)], n_rounds, controller.decision_stride):
            row["case"] = case
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# The reference run


def _signals_out(session: Session) -> dict[str, float | None]:
    return {name: session.last_signals.get(name) for name in SIGNAL_NAMES}


def run_cases(controller: Controller, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run `rift_ada.Controller` over input rows; one output row per input row (the port format)."""
    sessions: dict[int, Session] = {}
    output = []
    for row in rows:
        case = row["case"]
        session = sessions.get(case)
        if session is None:
            session = sessions[case] = controller.new_session()
        session.record_round(row["accepted_len"], row["entropies"])
        if "query_summary" in row:
            session.record_queries(row["query_summary"])
        if "query_drift" in row:
            drift = row["query_drift"]
            session.record_query_drift(math.nan if drift is None else drift)
        decisions = session.decisions
        refresh = session.decide(row["n_committed"])
        decision = session.decisions > decisions
        output.append(
            {
                "case": case,
                "round": row["round"],
                "decision": decision,
                "refresh": refresh,
                "signals": _signals_out(session) if decision else None,
            }
        )
    return output


def vectors_text(controller_dict: Mapping[str, Any], *, seed: int, n_cases: int = 4, n_rounds: int = 96) -> str:
    """The JSONL text of a vectors file for one controller (header + rows with expected outputs)."""
    controller = Controller.from_dict(controller_dict)
    rows = generate_cases(controller, seed, n_cases, n_rounds)
    expected = run_cases(controller, rows)
    header = {
        "format": VECTOR_FORMAT,
        "version": VECTOR_VERSION,
        "controller": controller.to_dict(),
        "seed": seed,
        "cases": n_cases,
        "rounds_per_case": n_rounds,
        "case_modes": [CASE_MODES[case % len(CASE_MODES)] for case in range(n_cases)],
        "tolerance": {"signals_abs": SIGNAL_ATOL, "signals_rel": SIGNAL_RTOL},
    }
    lines = [_dumps(header)]
    for row, out in zip(rows, expected, strict=True):
        lines.append(_dumps({**row, "expected": {key: out[key] for key in ("decision", "refresh", "signals")}}))
    return "\n".join(lines) + "\n"


def output_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """JSONL text of a port's output (header line + one row per round)."""
    lines = [_dumps({"format": OUTPUT_FORMAT, "version": VECTOR_VERSION})]
    lines.extend(_dumps(dict(row)) for row in rows)
    return "\n".join(lines) + "\n"


def vector_set(
    controller_paths: Sequence[str | Path], *, seed: int = 0, n_random: int = 6, n_cases: int = 4, n_rounds: int = 96
) -> dict[str, str]:
    """File name -> text of a whole vector set: one file per controller file, ``n_random`` random
    controllers, and ``manifest.json``. Deterministic: regenerating gives identical bytes."""
    files: dict[str, str] = {}
    entries = []
    for index, path in enumerate(sorted(Path(p) for p in controller_paths)):
        controller = Controller.load(path)
        name = f"{path.name.removesuffix('.json')}.jsonl"
        file_seed = seed * 1000 + index
        files[name] = vectors_text(controller.to_dict(), seed=file_seed, n_cases=n_cases, n_rounds=n_rounds)
        entries.append({"file": name, "controller": path.name, "seed": file_seed})
    for index in range(n_random):
        controller_seed = seed * 1000 + 500 + index
        name = f"random-{index:02d}.jsonl"
        data = random_controller_dict(controller_seed)
        files[name] = vectors_text(data, seed=controller_seed, n_cases=n_cases, n_rounds=n_rounds)
        entries.append({"file": name, "controller": data["name"], "seed": controller_seed})
    manifest = {
        "format": "rift-ada.conformance-set",
        "version": VECTOR_VERSION,
        "seed": seed,
        "cases_per_file": n_cases,
        "rounds_per_case": n_rounds,
        "files": entries,
        "command": (
            f"rift-ada conformance write --seed {seed} --random {n_random} --cases {n_cases} --rounds {n_rounds}"
        ),
    }
    files["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    return files


# ----------------------------------------------------------------------------------------------
# Reading and checking


def _read_jsonl(path: Path, expected_format: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConformanceError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConformanceError(f"{path}: cannot read: {exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConformanceError(f"{path}:{number}: not valid JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ConformanceError(f"{path}:{number}: expected a JSON object per line")
        records.append((number, record))
    if not records:
        raise ConformanceError(f"{path}: empty file")
    header = records[0][1]
    if header.get("format") != expected_format or header.get("version") != VECTOR_VERSION:
        raise ConformanceError(
            f"{path}:1: expected a header with format {expected_format!r} version {VECTOR_VERSION}, "
            f"got format {header.get('format')!r} version {header.get('version')!r}"
        )
    rows = []
    for number, record in records[1:]:
        for key in ("case", "round"):
            if not isinstance(record.get(key), int) or isinstance(record.get(key), bool):
                raise ConformanceError(f"{path}:{number}: field {key!r} must be an integer")
        record["_line"] = number
        rows.append(record)
    return header, rows


def load_vectors(path: str | Path) -> tuple[Controller, dict[str, Any], list[dict[str, Any]]]:
    """(controller, header, rows) of a vectors file; raises ConformanceError naming file and line."""
    header, rows = _read_jsonl(Path(path), VECTOR_FORMAT)
    controller = Controller.from_dict(header.get("controller"))
    for row in rows:
        for key in ("accepted_len", "entropies", "n_committed", "expected"):
            if key not in row:
                raise ConformanceError(f"{path}:{row['_line']}: missing field {key!r}")
    return controller, header, rows


def load_output(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a port's output file; raises ConformanceError naming file and line."""
    _, rows = _read_jsonl(Path(path), OUTPUT_FORMAT)
    for row in rows:
        for key in ("decision", "refresh", "signals"):
            if key not in row:
                raise ConformanceError(f"{path}:{row['_line']}: missing field {key!r}")
    return rows


@dataclass
class CheckResult:
    """Outcome of comparing a port's output with vectors: ``ok``, rounds compared, first difference."""

    ok: bool
    rounds_checked: int
    first_difference: str | None = None


def _close(expected: float | None, got: Any, atol: float, rtol: float) -> bool:
    if expected is None or got is None:
        return expected is None and got is None
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return abs(float(got) - expected) <= atol + rtol * abs(expected)


def _row_difference(expected: Mapping[str, Any], got: Mapping[str, Any], atol: float, rtol: float) -> str | None:
    for key in ("decision", "refresh"):
        if got[key] is not expected[key]:
            return f"{key}: expected {_dumps(expected[key])}, got {_dumps(got[key])}"
    want, have = expected["signals"], got["signals"]
    if want is None or have is None:
        return None if want is None and have is None else f"signals: expected {_dumps(want)}, got {_dumps(have)}"
    if not isinstance(have, dict):
        return f"signals: expected an object, got {_dumps(have)}"
    for name in SIGNAL_NAMES:
        if not _close(want.get(name), have.get(name), atol, rtol):
            return f"signal {name}: expected {_dumps(want.get(name))}, got {_dumps(have.get(name))}"
    return None


def check_output(vectors_path: str | Path, output_path: str | Path) -> CheckResult:
    """Compare a port's output with a vectors file; the first differing round is named."""
    _, header, rows = load_vectors(vectors_path)
    got_rows = load_output(output_path)
    tolerance = header.get("tolerance", {})
    atol = float(tolerance.get("signals_abs", SIGNAL_ATOL))
    rtol = float(tolerance.get("signals_rel", SIGNAL_RTOL))
    for count, (row, got) in enumerate(zip(rows, got_rows, strict=False)):
        where = f"case {row['case']} round {row['round']} (n_committed {row['n_committed']})"
        if (got["case"], got["round"]) != (row["case"], row["round"]):
            return CheckResult(
                False,
                count,
                f"{where}: the output's line {got['_line']} is case {got['case']} round {got['round']} "
                "(rows must follow the vectors' order)",
            )
        difference = _row_difference(row["expected"], got, atol, rtol)
        if difference is not None:
            return CheckResult(False, count, f"first difference at {where}: {difference}")
    if len(got_rows) != len(rows):
        shown = rows[len(got_rows)] if len(got_rows) < len(rows) else None
        detail = f"; first missing: case {shown['case']} round {shown['round']}" if shown else ""
        message = f"the output has {len(got_rows)} rounds, the vectors {len(rows)}{detail}"
        return CheckResult(False, min(len(rows), len(got_rows)), message)
    return CheckResult(True, len(rows))


def run_vectors(path: str | Path) -> str:
    """Output text of the reference port (`rift_ada.Controller`) on a vectors file."""
    controller, _, rows = load_vectors(path)
    return output_text(run_cases(controller, rows))
