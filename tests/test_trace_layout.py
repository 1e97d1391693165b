"""Trace layout v2: plain tools read committed rows only; leases; verified resume; partial/stray files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.trace_io import (
    TraceError,
    TraceWriter,
    check_complete,
    read_manifest,
    read_probe_traces,
    read_tables,
    trace_status,
    upgrade_layout,
    write_probe_traces,
)
from rift_ada.collectors.trace_io.readers import _probe_tables


def _traces(n_requests: int = 8):
    return synthetic_traces(n_requests, 97, vary_length=True, seed=11, segment_length=32)


def _killed_writer_leftovers(out: Path, traces) -> tuple[set[str], set[str]]:
    """A directory with 4 committed requests, then what a writer killed before its commit leaves.

    Returns (committed request ids, ids the killed writer had staged).
    """
    ids = traces.requests["request_id"].tolist()
    write_probe_traces(out, traces.subset(range(4)), batch_size=2)
    manifest = read_manifest(out)
    with TraceWriter(out, manifest, shard="1/2") as writer:
        part_id = writer.write_requests(_probe_tables(traces, np.array([4, 5])))
    # Undo the commit and the publish of that part: exactly the state of a writer killed after
    # staging its tables (before the commit record), plus a temporary it had not renamed yet.
    (out / "_commits" / f"{part_id}.json").unlink()
    for kind in ("requests", "positions", "strides"):
        (out / kind / f"{part_id}.parquet").rename(out / "_staging" / f"{part_id}.{kind}.parquet")
    (out / "_commits" / f".{part_id}.json.tmp-0badf00d").write_bytes(b'{"half": ')
    return set(ids[:4]), set(ids[4:6])


def test_plain_tools_see_only_committed_rows(tmp_path: Path):
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    traces = _traces()
    out = tmp_path / "t"
    committed, staged = _killed_writer_leftovers(out, traces)
    expected_positions = read_tables(out, ["positions"])["positions"].num_rows
    assert expected_positions == int(traces.osl[:4].sum()) * len(traces.arms)

    # pyarrow.dataset: one folder per kind ('_'/'.' names are skipped by default).
    requests = ds.dataset(out / "requests", format="parquet").to_table()
    assert set(requests["request_id"].to_pylist()) == committed
    assert ds.dataset(out / "positions", format="parquet").count_rows() == expected_positions
    # polars and DuckDB with a glob.
    frame = polars.read_parquet(str(out / "positions" / "*.parquet"))
    assert frame.height == expected_positions and set(frame["request_id"].unique().to_list()) == committed
    con = duckdb.connect()
    (count, n_ids) = con.execute(
        f"select count(*), count(distinct request_id) from read_parquet('{out}/strides/*.parquet')"
    ).fetchone()
    assert n_ids == 4 and count == read_tables(out, ["strides"])["strides"].num_rows
    # rift-ada's own reader agrees, and status names the leftovers.
    assert set(read_probe_traces(out).requests["request_id"].tolist()) == committed
    status = trace_status(out)
    assert len(status["uncommitted_files"]) == 4 and status["stray_files"] == []
    assert not staged & committed


def test_each_part_records_format_version_and_kind(tmp_path: Path):
    out = tmp_path / "t"
    write_probe_traces(out, _traces(3))
    for kind in ("requests", "positions", "strides"):
        (path,) = sorted((out / kind).glob("*.parquet"))
        meta = json.loads(pq.read_schema(path).metadata[b"rift_ada.traces"])
        assert meta == {"format": "rift-ada.traces", "version": 2, "kind": kind, "mode": "probe"}
    assert read_manifest(out)["version"] == 2


def test_writer_killed_after_commit_is_rolled_forward(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces, batch_size=4)
    record = json.loads(sorted((out / "_commits").glob("*.json"))[1].read_text())
    part_id = record["part_id"]
    # Killed between the commit record and the renames: positions published, the rest staged.
    for kind in ("requests", "strides"):
        (out / kind / f"{part_id}.parquet").rename(out / "_staging" / f"{part_id}.{kind}.parquet")
    back = read_probe_traces(out)  # reads staged files of committed parts
    assert back.n_requests == 8
    with TraceWriter(out, read_manifest(out), shard="3/4"):  # any writer publishes them
        pass
    assert (out / "requests" / f"{part_id}.parquet").is_file() and not any((out / "_staging").iterdir())
    assert ds.dataset(out / "requests", format="parquet").count_rows() == 8


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from rift_ada.collectors.trace_io import TraceWriter, read_manifest
    writer = TraceWriter(sys.argv[1], read_manifest(sys.argv[1]), shard="0/2")
    print("ready", flush=True)
    time.sleep(120)
    """
)


def _start_holder(out: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise AssertionError(process.stderr.read())
    return process


def test_second_writer_of_a_shard_is_refused_and_a_dead_holder_is_taken_over(tmp_path: Path):
    traces = _traces(4)
    out = tmp_path / "t"
    write_probe_traces(out, traces.subset(range(2)))
    holder = _start_holder(out)
    try:
        with pytest.raises(TraceError) as error:
            TraceWriter(out, read_manifest(out), shard="0/2")
        message = str(error.value)
        assert f"pid {holder.pid}" in message and socket.gethostname() in message and "s0of2.lock" in message
        # Other shards are not blocked, and status shows the live writer.
        with TraceWriter(out, read_manifest(out), shard="1/2"):
            pass
        writers = {row["shard"]: row["writer"] for row in trace_status(out)["shards"]}
        assert writers["0/2"]["pid"] == holder.pid
        # A writer with another shard count would overlap the live one's requests.
        with pytest.raises(TraceError, match=r"s0of2 is being written now .* with 2 shards, this writer uses 3"):
            TraceWriter(out, read_manifest(out), shard="1/3")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder died without releasing: the next writer takes the lease over and says whose it was.
    with TraceWriter(out, read_manifest(out), shard="0/2") as writer:
        assert writer.took_over is not None and writer.took_over["pid"] == holder.pid
        writer.write_requests(_probe_tables(traces, np.array([2])))
    # A clean close leaves nothing to take over; in-process double open is refused too.
    with TraceWriter(out, read_manifest(out), shard="0/2") as writer:
        assert writer.took_over is None
        with pytest.raises(TraceError, match="already being written by pid"):
            TraceWriter(out, read_manifest(out), shard="0/2")


def test_flipped_byte_is_detected_on_resume(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces, batch_size=4)
    path = sorted((out / "positions").glob("*.parquet"))[1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the sha256 can tell
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=rf"{path.name}: modified \(sha256 differs from its record\)") as error:
        write_probe_traces(out, traces)
    assert "delete the part's files" in str(error.value)
    with TraceWriter(out, read_manifest(out), verify=False) as writer:  # size-only check, documented escape
        assert len(writer.completed_request_ids()) == 8


def test_partial_collection_is_refused_unless_allowed(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    manifest = dict(traces.manifest, n_requests=8, request_ids=sorted(traces.requests["request_id"].tolist()))
    write_probe_traces(out, traces.subset(range(6)), manifest)
    missing = sorted(traces.requests["request_id"].tolist())[-2:]
    with pytest.raises(TraceError, match=r"partial collection: 6 of 8 requests committed") as error:
        check_complete(out)
    assert str(missing[:1])[1:-1] in str(error.value) and "--allow-partial" in str(error.value)
    status = check_complete(out, allow_partial=True)
    assert status["partial"] and status["missing_request_ids"] == sorted(
        set(manifest["request_ids"]) - set(traces.requests["request_id"][:6].tolist())
    )
    write_probe_traces(out, traces, manifest)
    assert check_complete(out)["partial"] is False


def test_evaluate_cli_refuses_a_partial_collection_unless_allowed(tmp_path: Path):
    from typer.testing import CliRunner

    from rift_ada.cli.app import app

    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces.subset(range(6)), dict(traces.manifest, n_requests=8))
    runner = CliRunner()
    refused = runner.invoke(app, ["evaluate", "--traces", str(out), "--policy", "stat"])
    text = " ".join(refused.output.split())  # rich wraps long lines
    assert refused.exit_code != 0 and "partial collection: 6 of 8 requests committed" in text
    assert "--allow-partial" in text
    allowed = runner.invoke(app, ["evaluate", "--traces", str(out), "--policy", "stat", "--allow-partial"])
    assert allowed.exit_code == 0, allowed.output
    text = " ".join(allowed.output.split())
    assert "partial collection: 6 of 8 requests committed" in text and "mean AL" in text


def test_stray_files_are_ignored_by_name(tmp_path: Path):
    traces = _traces(4)
    out = tmp_path / "t"
    write_probe_traces(out, traces)
    (out / "_commits" / "notes.commit.json").write_text("{not a commit record")
    (out / "_commits" / "copy of s0of1-000001-0123456789ab.json").write_text("{}")
    (out / "positions" / "README.txt").write_text("hello")
    (out / "_staging" / "editor.swp").write_bytes(b"\0")
    _assert_requests = read_probe_traces(out).requests["request_id"].tolist()
    assert len(_assert_requests) == 4
    write_probe_traces(out, traces)  # resume is not stopped either
    status = trace_status(out)
    assert sorted(status["stray_files"]) == sorted(
        ["_commits/notes.commit.json", "_commits/copy of s0of1-000001-0123456789ab.json",
         "positions/README.txt", "_staging/editor.swp"]
    )  # fmt: skip
    assert status["uncommitted_files"] == []


def _to_version_1(out: Path) -> None:
    """Rewrite a v2 directory as the old layout: every file in parts/, commit records *.commit.json."""
    parts = out / "parts"
    parts.mkdir()
    for commit in sorted((out / "_commits").glob("*.json")):
        record = json.loads(commit.read_text())
        part_id = record["part_id"]
        for kind, info in record["files"].items():
            name = f"{part_id}.{kind}.parquet"
            (out / info["file"]).rename(parts / name)
            info["file"] = name
        (parts / f"{part_id}.commit.json").write_text(json.dumps(record))
    for folder in ("_commits", "_staging", "_leases", "requests", "positions", "strides"):
        shutil.rmtree(out / folder)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 1}))


def test_old_layout_is_read_refused_for_writing_and_upgraded(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces, batch_size=3)
    reference = read_probe_traces(out)
    _to_version_1(out)
    (out / "parts" / "s0of1-000009-0123456789ab.requests.parquet").write_bytes(b"uncommitted")
    old = read_probe_traces(out)
    np.testing.assert_array_equal(old.outcome, reference.outcome)
    assert trace_status(out)["layout_version"] == 1
    with pytest.raises(TraceError, match=r"version-1 layout .*rift-ada status .* --upgrade"):
        write_probe_traces(out, traces)
    assert upgrade_layout(out) == 3
    assert not (out / "parts").exists() and read_manifest(out)["version"] == 2
    np.testing.assert_array_equal(read_probe_traces(out).outcome, reference.outcome)
    assert ds.dataset(out / "requests", format="parquet").count_rows() == 8
    write_probe_traces(out, traces)  # writable again; nothing left to do


def test_lease_is_released_when_writer_init_fails(tmp_path: Path):
    traces = _traces(4)
    out = tmp_path / "t"
    write_probe_traces(out, traces)
    path = sorted((out / "strides").glob("*.parquet"))[0]
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(TraceError, match="missing or truncated"):
        TraceWriter(out, read_manifest(out))
    os.remove(path)
    with pytest.raises(TraceError, match="missing or truncated"):  # not "already being written"
        TraceWriter(out, read_manifest(out))


def test_a_status_reader_does_not_make_a_writer_fail(tmp_path: Path):
    import fcntl
    import threading

    out = tmp_path / "t"
    write_probe_traces(out, _traces(2))
    lease_path = out / "_leases" / "s0of1.lock"
    handle = open(lease_path, "a+b")  # noqa: SIM115 - released by the timer below
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # what `rift-ada status` takes briefly
    timer = threading.Timer(0.3, handle.close)
    timer.start()
    with TraceWriter(out, read_manifest(out)) as writer:  # waits for the reader instead of failing
        assert writer.took_over is None
    timer.join()
