"""The one atomic file writer: a temporary sibling, fsync, then a rename over the target.

A reader sees either the old file or the new one, never a half-written one, and a crash or an
exception mid-write leaves the previous file in place (the temporary is removed). Stdlib only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call ``write(temporary_path)``, fsync the result and rename it onto ``path``; returns ``path``.

    ``write`` gets a path in the same folder (so the rename is atomic), named ``.<name>.tmp-<random>``:
    it does not end in ``path``'s suffix, so writers that infer a format from the name need it given.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)  # trace_io cleans ".tmp-" names
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
