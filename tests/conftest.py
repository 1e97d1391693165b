import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one torch thread each, as
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two threads per worker would oversubscribe the cores
    os.environ.setdefault("MKL_NUM_THREADS", "1")  # (set before torch is imported; subprocesses inherit it)
sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

import pytest  # noqa: E402

from rift_ada.memory import cap_heap_growth  # noqa: E402

cap_heap_growth()  # as the CLI does: model tests otherwise grow glibc's heap by GBs


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run many small forwards: extra threads only spin (use via pytestmark usefixtures)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random llama with the embedded SmolLM2 tokenizer, saved as a local model directory.

    Only the tokenizer of SmolLM2 is loaded (not its weights). Read-only for tests: copy it to change it.
    """
    from rift_ada.models import save_tiny_random_llama

    return save_tiny_random_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def bench_tiny_dir(tiny_model_dir, tmp_path_factory):
    """One tiny `rift-ada bench` run through the CLI (with a results page and exported controllers), shared.

    Read-only for tests: copy it to change it. Layout: ``run/`` (the run), ``docs/results.md``, ``controllers/``.
    """
    from typer.testing import CliRunner

    from rift_ada.cli.app import app

    out = tmp_path_factory.mktemp("bench") / "run"
    arguments = ["bench", "--size", "tiny", "--model", str(tiny_model_dir), "--out", str(out)]
    arguments += ["--results", str(out.parent / "docs" / "results.md")]
    arguments += ["--export-controllers", str(out.parent / "controllers")]
    outcome = CliRunner().invoke(app, arguments)
    assert outcome.exit_code == 0, outcome.output
    return out
