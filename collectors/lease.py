"""One writer per shard: an exclusive ``flock`` lease file that names its holder.

``ShardLease.acquire(dir, "s0of4")`` opens ``dir/s0of4.lock`` and takes an exclusive,
non-blocking ``flock`` on it, then records the holder (host, pid, start time) in the file. A
second writer of the same shard fails at once with a :class:`LeaseHeldError` naming the holder.
The kernel (or, on NFS, the lock manager) drops the lock when the holder dies, so the lease of a
dead process is taken over by the next writer without any clean-up; ``took_over`` then holds the
dead holder's record (a clean :meth:`release` empties the file first, so it is None after a
normal exit).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rift_ada.atomic import reporting_disk_full

_ATTEMPTS = 40  # x _RETRY_S: how long an unrecorded holder (a reader, a starting writer) is waited for
_RETRY_S = 0.05


class LeaseHeldError(RuntimeError):
    """Another live process holds the lease; the message names the lease file, host and pid."""


def _read_holder(handle: IO[bytes]) -> dict[str, Any] | None:
    handle.seek(0)
    data = handle.read()
    if not data.strip():
        return None
    try:
        holder = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host gpu-7 since 2026-…`` (or a note that the holder is not recorded yet)."""
    if not holder:
        return "a process that has not recorded itself yet"
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}"


def read_lease(path: str | Path) -> dict[str, Any]:
    """``{"held": bool, "holder": dict | None}`` for a lease file, without taking it."""
    path = Path(path)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"held": True, "holder": _read_holder(handle)}
        try:
            return {"held": False, "holder": _read_holder(handle)}
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class ShardLease:
    """An exclusive lease on ``<directory>/<name>.lock``, held until :meth:`release` or process exit."""

    def __init__(self, path: Path, handle: IO[bytes], holder: dict[str, Any], took_over: dict[str, Any] | None):
        self.path, self._handle, self.holder, self.took_over = path, handle, holder, took_over

    @classmethod
    def acquire(cls, directory: str | Path, name: str, *, what: str | None = None) -> ShardLease:
        """Take ``directory/<name>.lock``; ``what`` names the work in the refusal (default: ``shard <name>``)."""
        directory = Path(directory)
        path = directory / f"{name}.lock"
        with reporting_disk_full(path):
            directory.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+b")  # noqa: SIM115 - the handle lives as long as the lease
        for attempt in range(_ATTEMPTS):
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_holder(handle)
                # No holder recorded: a reader (`rift-ada status`) holds it for a moment, or a
                # writer is starting; look again before refusing.
                if holder is None and attempt + 1 < _ATTEMPTS:
                    time.sleep(_RETRY_S)
                    continue
                handle.close()
                if what is None:
                    message = (f"{path}: shard {name} is already being written by {describe_holder(holder)}; "
                               "wait for that writer to finish (or stop it) - one writer per shard")  # fmt: skip
                else:
                    message = (f"{path}: {what} is already running as {describe_holder(holder)}; "
                               "wait for it to finish (or stop it) - one process per run directory")  # fmt: skip
                raise LeaseHeldError(message) from None
        took_over = _read_holder(handle)
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        try:
            with reporting_disk_full(path):
                handle.seek(0)
                handle.truncate()
                handle.write(json.dumps(holder).encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            handle.close()
            raise
        return cls(path, handle, holder, took_over)

    @property
    def held(self) -> bool:
        return not self._handle.closed

    def release(self) -> None:
        """Empty the lease file (a clean exit) and drop the lock; idempotent."""
        if self._handle.closed:
            return
        try:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.flush()
        finally:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()


@contextlib.contextmanager
def run_lock(directory: str | Path, name: str, what: str) -> Iterator[ShardLease]:
    """Hold ``directory/<name>.lock`` while the body runs: one ``what`` (e.g. ``rift-ada bench``) per run directory.

    A second process is refused with a :class:`LeaseHeldError` naming the live one (host, pid). The
    lock of a process that died (killed, preempted) is taken over, with a warning naming it."""
    lease = ShardLease.acquire(directory, name, what=what)
    if lease.took_over:
        logging.getLogger("rift_ada").warning(
            "%s: taking over from %s (it stopped without releasing the lock; its work is resumed)",
            lease.path, describe_holder(lease.took_over),
        )  # fmt: skip
    try:
        yield lease
    finally:
        lease.release()


__all__ = ["LeaseHeldError", "ShardLease", "describe_holder", "read_lease", "run_lock"]
