"""One `bench` / `train` per run directory: a second invocation is refused naming the live one (host, pid);
the lock of a process that was killed is taken over, with a warning naming it."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rift_ada.cli.app import app
from rift_ada.collectors.lease import LeaseHeldError, read_lease, run_lock

HOLD = """
import sys, time
from rift_ada.collectors.lease import ShardLease
lease = ShardLease.acquire(sys.argv[1], sys.argv[2], what="test")
print("held", flush=True)
time.sleep(120)
"""


def hold_lock(directory: Path, name: str) -> subprocess.Popen:
    """Another process holding ``directory/<name>.lock`` (as a live `bench` or `train` would)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), name], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


@pytest.fixture
def no_model_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    import rift_ada.collectors.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_pair", loaded)


@pytest.mark.parametrize(
    ("command", "lock"),
    [
        (["bench", "--size", "tiny", "--model", "smollm2-135m"], "bench"),
        (["train", "--model", "smollm2-135m", "--steps", "1"], "train"),
    ],
)
def test_a_second_invocation_on_a_run_directory_is_refused_naming_the_live_one(command, lock, tmp_path, no_model_loads):
    out = tmp_path / "run"
    holder = hold_lock(out, lock)
    try:
        result = CliRunner().invoke(app, [*command, "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and str(out / f"{lock}.lock") in line
        assert f"pid {holder.pid} on host {socket.gethostname()}" in line and "already running" in line
        # refused before any work: the fixture fails the test if a model is loaded
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holders_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = hold_lock(tmp_path, "bench")
    with pytest.raises(LeaseHeldError, match=f"pid {holder.pid}"), run_lock(tmp_path, "bench", what="rift-ada bench"):
        pass
    holder.send_signal(signal.SIGKILL)  # preempted: no clean release, its record stays in the file
    holder.wait()
    left = read_lease(tmp_path / "bench.lock")
    assert not left["held"] and left["holder"]["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="rift_ada"), run_lock(tmp_path, "bench", what="bench") as lease:
        assert lease.took_over is not None and lease.took_over["pid"] == holder.pid
        assert read_lease(tmp_path / "bench.lock")["held"]
    assert f"taking over from pid {holder.pid}" in caplog.text
    assert read_lease(tmp_path / "bench.lock") == {"held": False, "holder": None}  # a clean exit empties it
    with run_lock(tmp_path, "bench", what="rift-ada bench") as lease:  # and the next run takes it silently
        assert lease.took_over is None
