"""Helpers every command module shares: the console, the progress reporter and the pre-flight checks.

The checks run before any model loads; each ends as a usage error (exit 2) naming the option, or
as one plain ``error: ...`` line (exit 1) when an output path cannot be written (cli/_errors.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console

from rift_ada.cli._errors import bad_option, describe_error, fail, note_output
from rift_ada.cli._progress import ProgressReporter

__all__ = ["check_dataset", "check_model", "check_writable", "console", "progress_reporter"]

console = Console(highlight=False)
if not console.is_terminal:  # logs and pipes: tables at their natural width, nothing folded or cut
    console = Console(highlight=False, width=100_000)


def progress_reporter() -> ProgressReporter:
    """The progress reporter every command uses (bars on a terminal, log lines elsewhere)."""
    return ProgressReporter()


def check_model(model: str) -> Any:
    """The preset (or local path / Hub id) ``--model`` names; a usage error when there is none."""
    from rift_ada.models import ModelError, resolve_preset

    try:
        return resolve_preset(model)
    except ModelError as error:
        bad_option("--model", str(error))


def check_dataset(dataset: str) -> None:
    """File-based dataset specs are read now (cheap); the embedded ones need the tokenizer later."""
    if dataset.strip() in ("embedded", "embedded:small"):
        return
    from rift_ada.collectors.datasets import load_dataset

    try:
        load_dataset(dataset)
    except (ValueError, OSError) as error:
        bad_option("--dataset", str(error))


def check_writable(path: Path, option: str, root: Path | None = None) -> None:
    """The directory ``path`` will be written into can be made and written (tried now, before any work).

    ``root``: the folder ``option`` names when ``path`` is a file in it (errors under it name ``option``)."""
    note_output(root if root is not None else path, option)
    if path.is_dir() and path.suffix:
        fail(f"{path}: is a directory ({option})")
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".rift-ada-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        fail(f"cannot write {option} {path}: {describe_error(error)}")
