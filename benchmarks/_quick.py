"""What the benchmarks' ``--quick`` modes share: a tiny random model, so that a quick run loads no real
weights, downloads nothing and takes seconds (tests/test_bench_quick.py runs every quick mode).

Not a benchmark itself (the leading underscore keeps it out of the test's list of scripts).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


def tiny_model(folder: Path) -> Path:
    """A 2-layer random llama with the embedded SmolLM2 tokenizer, saved as a local model directory."""
    import torch
    import transformers

    from rift_ada.models import PRESETS, load_tokenizer

    tokenizer = load_tokenizer(PRESETS["smollm2-135m"].draft)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def model_or_tiny(model: str | None) -> Iterator[str]:
    """``model`` as given, or (None) a :func:`tiny_model` in a temporary folder for the length of the block."""
    if model is not None:
        yield model
        return
    with tempfile.TemporaryDirectory(prefix="rift-ada-quick-model-") as folder:
        yield str(tiny_model(Path(folder)))


@contextlib.contextmanager
def out_or_temporary(out: Path | None) -> Iterator[Path]:
    """``out`` as given, or (None) a temporary folder for the length of the block."""
    if out is not None:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="rift-ada-quick-") as folder:
        yield Path(folder)
