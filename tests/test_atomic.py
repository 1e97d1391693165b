"""The one atomic writer: a failed write keeps the previous file and leaves no temporary behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rift_ada.atomic import atomic_write, atomic_write_json, atomic_write_text, json_safe


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "sub" / "results.json"
    atomic_write_text(target, "old\n")

    def half_then_crash(temporary: Path) -> None:
        temporary.write_text('{"half": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_crash)
    assert target.read_text() == "old\n"
    assert sorted(path.name for path in target.parent.iterdir()) == ["results.json"]


def test_the_written_file_has_the_usual_mode_and_content(tmp_path: Path):
    umask = os.umask(0o022)
    try:
        path = atomic_write_json(tmp_path / "a.json", json_safe({"value": float("nan"), "n": 3}))
    finally:
        os.umask(umask)
    assert json.loads(path.read_text()) == {"n": 3, "value": None}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_temporaries_carry_the_marker_the_trace_cleanup_looks_for(tmp_path: Path):
    seen = []
    atomic_write(tmp_path / "part.json", lambda temporary: (seen.append(temporary.name), temporary.write_text("{}")))
    assert seen[0].startswith(".part.json.tmp-")
