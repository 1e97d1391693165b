"""atomic_publish_dir swaps a finished folder in whole; is_disk_full reads every layer's wording."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from rift_ada.atomic import DiskFullError, atomic_publish_dir, is_disk_full, reporting_disk_full


def test_publishing_a_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "model"
    for version in ("old", "new"):
        staging = tmp_path / f".model.tmp-{version}"
        staging.mkdir()
        (staging / "weights.bin").write_text(version)
        (staging / version).write_text("")
        atomic_publish_dir(staging, target)
        assert not staging.exists()
    assert sorted(p.name for p in target.iterdir()) == ["new", "weights.bin"]
    assert (target / "weights.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the old folder is gone too


def test_full_disk_wordings_of_each_layer_are_recognised(tmp_path):
    class SafetensorError(Exception):
        pass

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert is_disk_full(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    wrapped = RuntimeError("An exception is raised during the commit.")
    wrapped.__cause__ = sqlite3.OperationalError("database or disk is full")
    assert is_disk_full(wrapped)
    assert not is_disk_full(ValueError("bad value")) and not is_disk_full(OSError(errno.EACCES, "denied"))
    with pytest.raises(DiskFullError) as raised, reporting_disk_full(tmp_path / "study.db"):
        raise wrapped
    assert raised.value.filename == str(tmp_path / "study.db") and raised.value.errno == errno.ENOSPC
    with pytest.raises(ValueError), reporting_disk_full(tmp_path / "x"):  # other errors pass unchanged
        raise ValueError("bad value")
