"""What the benchmarks' ``--quick`` modes share: a tiny random model, so that a quick run loads no real
weights, downloads nothing and takes seconds (tests/test_bench_quick.py runs every quick mode).

Not a benchmark itself (the leading underscore keeps it out of the test's list of scripts).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rift_ada.models import save_tiny_random_llama


@contextlib.contextmanager
def model_or_tiny(model: str | None) -> Iterator[str]:
    """``model`` as given, or (None) the tests' tiny random llama (:func:`rift_ada.models.save_tiny_random_llama`)
    in a temporary folder for the length of the block."""
    if model is not None:
        yield model
        return
    with tempfile.TemporaryDirectory(prefix="rift-ada-quick-model-") as folder:
        yield str(save_tiny_random_llama(folder))


@contextlib.contextmanager
def out_or_temporary(out: Path | None) -> Iterator[Path]:
    """``out`` as given, or (None) a temporary folder for the length of the block."""
    if out is not None:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="rift-ada-quick-") as folder:
        yield Path(folder)
