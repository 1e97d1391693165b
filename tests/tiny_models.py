"""Tiny random-weight models of each architecture the cache must handle (built from configs)."""

from __future__ import annotations

import torch
import transformers

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
ARCHITECTURES = ("llama", "qwen3", "qwen3_5", "gpt_oss", "nemotron_h")


_CONFIGS: dict[str, tuple[type, dict]] = {
    "llama": (transformers.LlamaConfig, _COMMON),
    "qwen3": (transformers.Qwen3Config, _COMMON),
    "qwen3_5": (
        transformers.Qwen3_5TextConfig,
        {
            **_COMMON,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
    ),
    "gpt_oss": (
        transformers.GptOssConfig,
        {**_COMMON, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8},
    ),
    "nemotron_h": (
        transformers.NemotronHConfig,
        {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 1,
            "hybrid_override_pattern": "M*M-",
        },
    ),
}


def tiny_config(architecture: str, **overrides: object) -> transformers.PretrainedConfig:
    """A tiny config of ``architecture``; ``overrides`` replace its fields (applied at construction)."""
    config_class, fields = _CONFIGS[architecture]
    return config_class(**{**fields, **overrides})


def tiny_model(architecture: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(architecture))
    # Sharpen the random model so greedy choices are not near-ties.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()
