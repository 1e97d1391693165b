"""How the CLI reports errors: one plain line on stderr naming the file or field, no traceback.

Exit codes: 2 for usage errors (a bad option, raised as :class:`typer.BadParameter` before any
model loads), 1 for runtime errors a user can cause (a bad file, a read-only or full disk, a
storage error). A full disk is reported as ``<path>: disk is full (no space left on device); set by
--option`` whatever layer saw it (rift_ada/atomic.py). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.text import Text

EXIT_RUNTIME = 1  # usage errors exit 2 (typer.BadParameter, raised by bad_option)

# Messages are printed as plain text (never parsed as rich markup); cut so that a hostile input
# (a 10 MB controller name in an error) cannot flood a log.
MAX_MESSAGE_CHARS = 2000

stderr_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _shorten(message: str) -> str:
    message = " ".join(message.split()) if "\n" in message else message
    if len(message) > MAX_MESSAGE_CHARS:
        return message[:MAX_MESSAGE_CHARS] + f"... ({len(message) - MAX_MESSAGE_CHARS} more characters)"
    return message


# Output paths a command was given, with the option that set each (``note_output``): a full disk
# while writing under one of them is reported with that option.
_OUTPUTS: list[tuple[Path, str]] = []


def note_output(path: str | os.PathLike[str], option: str) -> None:
    """Remember that ``option`` set the output ``path`` (a file, or a folder written under)."""
    _OUTPUTS.append((Path(os.path.abspath(path)), option))


def _under(where: Path, root: Path) -> bool:
    """``where`` is ``root``, inside it, or a sibling named after it (``out.parquet.parts/...``)."""
    text, prefix = str(where), str(root)
    return text == prefix or (text.startswith(prefix) and text[len(prefix)] in "/.")


def _option_for(path: str) -> str | None:
    where = Path(os.path.abspath(path))
    found = [(len(root.parts), option) for root, option in _OUTPUTS if _under(where, root)]
    return max(found)[1] if found else None


def _disk_full_path(error: BaseException) -> str | None:
    """The file a full-disk error names (``DiskFullError`` or any ENOSPC ``OSError`` with a file name)."""
    from rift_ada.atomic import is_disk_full

    current: BaseException | None = error
    while current is not None:
        if isinstance(current, OSError) and current.filename is not None and is_disk_full(current):
            return str(current.filename)
        current = current.__cause__ or current.__context__
    return None


def describe_error(error: BaseException) -> str:
    """One line for an error: OSErrors name their path and reason; a full disk names the path (and its option)."""
    from rift_ada.atomic import is_disk_full

    if is_disk_full(error):
        path = _disk_full_path(error)
        if path is not None:
            option = _option_for(path)
            return f"{path}: disk is full (no space left on device)" + (f"; set by {option}" if option else "")
        return f"disk is full (no space left on device): {error}"
    if isinstance(error, OSError) and error.filename is not None:
        reason = error.strerror or str(error)
        where = str(error.filename) + (f" -> {error.filename2}" if error.filename2 else "")
        return f"{where}: {reason}"
    original = getattr(error, "orig", None)  # SQLAlchemy wraps the driver's error (and adds a help link)
    if isinstance(original, BaseException):
        return f"storage error: {type(original).__name__}: {original}"
    text = str(error)
    if isinstance(error, KeyError) and error.args:
        text = f"missing {error.args[0]!r}"
    return text or type(error).__name__


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, as plain text."""
    line = Text("error: ", style="red")
    line.append(_shorten(message))
    stderr_console.print(line)


def fail(error: BaseException | str, code: int = EXIT_RUNTIME) -> NoReturn:
    """Report an error on stderr and end the command with ``code`` (1: runtime, 2: usage)."""
    print_error(error if isinstance(error, str) else describe_error(error))
    raise typer.Exit(code=code)


def bad_option(option: str, problem: str) -> NoReturn:
    """A usage error naming the option (exit 2, before any model loads)."""
    raise typer.BadParameter(problem, param_hint=f"'{option}'")


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions a user can cause (bad input, disks, storages): reported in one line, exit 1."""
    types: list[type[BaseException]] = [ValueError, OSError]
    for module, name in (
        ("sqlalchemy.exc", "SQLAlchemyError"),
        ("optuna.exceptions", "StorageInternalError"),
        ("optuna.exceptions", "DuplicatedStudyError"),
        ("pyarrow", "ArrowException"),
        ("rift_ada.collectors.lease", "LeaseHeldError"),
    ):
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            types.append(found)
    return tuple(types)


class ReportingGroup(typer.core.TyperGroup):
    """The app's click group: user errors from any command end as one line on stderr with exit 1."""

    def invoke(self, ctx: Any) -> Any:
        _OUTPUTS.clear()  # each command notes its own output paths
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):  # usage errors and exits: typer reports them
            raise
        except user_error_types() as error:
            print_error(describe_error(error))
            raise typer.Exit(code=EXIT_RUNTIME) from None
        except Exception as error:  # a full disk seen by a library that raises its own type (torch, safetensors)
            from rift_ada.atomic import is_disk_full

            if not is_disk_full(error):
                raise
            print_error(describe_error(error))
            raise typer.Exit(code=EXIT_RUNTIME) from None
