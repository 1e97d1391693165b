"""The one place files are written: atomic writers, strict JSON, and full-disk errors that name the path.

:func:`atomic_write` writes a temporary sibling, fsyncs it and renames it over the target: a reader
sees the old file or the new one, never a half-written one, and a crash or an exception mid-write
leaves the previous file in place (the temporary is removed). Every writer here reports a full
disk as a :class:`DiskFullError` naming the file it was writing, whatever layer noticed it (an
``OSError`` without a file name from a buffered write, pyarrow, torch, safetensors, SQLite's
``database or disk is full``): :func:`reporting_disk_full` turns those into one error. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DiskFullError",
    "atomic_publish_dir",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "is_disk_full",
    "json_default",
    "json_safe",
    "reporting_disk_full",
]

# How layers below Python say "disk full" when they do not raise OSError(ENOSPC): SQLite
# (SQLITE_FULL), Rust's io::ErrorKind::StorageFull (safetensors), C++ messages (arrow, torch).
_DISK_FULL_TEXTS = ("no space left on device", "database or disk is full", "storagefull", "disk quota exceeded")


class DiskFullError(OSError):
    """The disk (or quota) filled while writing ``filename``; ``errno`` is ENOSPC."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.ENOSPC, "disk is full (no space left on device)", str(path))


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        original = getattr(current, "orig", None)  # SQLAlchemy keeps the driver's error here
        todo += [current.__cause__, current.__context__, original if isinstance(original, BaseException) else None]


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` or anything it was raised from says the disk (or a quota) is full."""
    for current in _chain(error):
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(current).lower() for text in _DISK_FULL_TEXTS):
            return True
    return False


def _no_room_left(directory: Path) -> bool:
    """The file system of ``directory`` has no block left for us (a writer that failed without saying why)."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 64 * 1024


@contextlib.contextmanager
def reporting_disk_full(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise a full-disk error from the body as :class:`DiskFullError` naming ``path``.

    Other errors pass unchanged, except one raised while ``path``'s file system has no room left
    (torch, for one, says only "file write failed"): that is a full disk too."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        where = Path(path)
        if is_disk_full(error) or _no_room_left(where if where.is_dir() else where.parent):
            raise DiskFullError(path) from error
        raise


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call ``write(temporary_path)``, fsync the result and rename it onto ``path``; returns ``path``.

    ``write`` gets a path in the same folder (so the rename is atomic), named ``.<name>.tmp-<random>``:
    it does not end in ``path``'s suffix, so writers that infer a format from the name need it given.
    A full disk at any step raises :class:`DiskFullError` naming ``path``; the old file stays.
    """
    target = Path(path)
    with reporting_disk_full(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)  # trace_io cleans ".tmp-"
        os.close(fd)
        temporary = Path(name)
        try:
            write(temporary)
            with open(temporary, "rb+") as handle:
                os.fsync(handle.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    return target


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Atomic write of ``data`` (see :func:`atomic_write`)."""
    return atomic_write(path, lambda temporary: temporary.write_bytes(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Atomic UTF-8 text write (see :func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # a file system or kernel without it
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def atomic_publish_dir(staging: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Put the finished folder ``staging`` (a sibling of ``target``) in ``target``'s place; returns ``target``.

    The files are fsynced first. An existing ``target`` is swapped with ``staging`` in one step
    (Linux ``renameat2``), so a reader or a crash sees the old folder or the new one, never none;
    where the kernel cannot swap, the old folder is renamed aside just before, and removed only
    after the new one is in place.
    """
    import shutil

    staging, target = Path(staging), Path(target)
    with reporting_disk_full(staging):
        _fsync_tree(staging)
        if not target.exists():
            os.replace(staging, target)
            return target
        if _exchange(staging, target):
            shutil.rmtree(staging)  # now the old folder
            return target
        aside = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, aside)
        os.replace(staging, target)
        shutil.rmtree(aside)
    return target


def json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    """Indented, key-sorted JSON with a trailing newline (stable across runs)."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=json_default) + "\n"


def json_safe(obj: Any) -> Any:
    """``obj`` with numpy values as Python ones and NaN / infinity as None (strict JSON has neither)."""
    if isinstance(obj, dict):
        return {key: json_safe(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(value) for value in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, str):
        return json_safe(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomic write of :func:`canonical_json` ``obj``."""
    return atomic_write_text(path, canonical_json(obj))
