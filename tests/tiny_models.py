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
ARCHITECTURES = ("llama", "qwen3", "qwen3_5", "gpt_oss", "nemotron_h", "gemma3_text")


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
    # Gemma3's differences, all kept: sliding and full layers with their own RoPE bases, q/k norms
    # (weights randomised in `tiny_model`), query_pre_attn_scalar != head_dim, one KV head, tied embeddings.
    "gemma3_text": (
        transformers.Gemma3TextConfig,
        {
            **_COMMON,
            "num_key_value_heads": 1,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
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
        if architecture == "gemma3_text":  # Gemma's norms scale by (1 + w), w = 0 at init: give them weights
            generator = torch.Generator().manual_seed(seed)
            for name, parameter in model.named_parameters():
                if name.endswith("norm.weight"):
                    parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def ragged_forced_requests(count: int = 20) -> list:
    """``count`` ragged closed-loop requests for a tiny model (vocabulary 96): RIFT-stat and SnapKV in turn,
    periodic refresh every 6 tokens, every third teacher-forced; the same requests at every call."""
    from rift_ada.budget import make_policy
    from rift_ada.speculative import BatchRequest, PeriodicRefresh

    policies = [make_policy("rift-stat", budget=16, obs_window=8), make_policy("snapkv", budget=12, obs_window=8)]
    prompts = torch.Generator().manual_seed(5)
    return [
        BatchRequest(
            torch.randint(0, 96, (12 + 3 * index,), generator=prompts).tolist(),
            policies[index % 2],
            max_new_tokens=24 + index % 5,
            seed=index,
            refresh_hook=PeriodicRefresh(6),
            forced_tokens=torch.randint(0, 96, (26,), generator=prompts).tolist() if index % 3 == 0 else None,
        )
        for index in range(count)
    ]
