"""Training-time attention: apply per-sample compression masks, or capture dense attention scores.

``install_training_attention(model)`` routes the model's attention through ``rift-train-<base>``.
Outside a :func:`masked` / :func:`capture_scores` block it is the model's own attention. Only layers that
call the attention interface and are not sliding-window layers are touched, so on hybrid models
(Qwen3.5 Gated DeltaNet, Nemotron-H Mamba, GPT-OSS sliding layers) only full attention is masked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

NAME = "rift-train"
_state = threading.local()


def _is_full_attention(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    return not (kwargs.get("sliding_window") or getattr(module, "sliding_window", None))


def _repeat_kv(states: torch.Tensor, group: int) -> torch.Tensor:
    return states if group == 1 else states.repeat_interleave(group, dim=1)


def _scored_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Causal attention with explicit probabilities; adds their mean over heads to the capture buffer."""
    group = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, group), _repeat_kv(value, group)
    logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
    n_q, n_k = logits.shape[-2:]
    causal = torch.ones(n_q, n_k, dtype=torch.bool, device=logits.device).tril(n_k - n_q)
    logits = logits.masked_fill(~causal, float("-inf"))
    sinks = getattr(module, "sinks", None)
    if sinks is not None:
        sink = sinks.float().reshape(1, -1, 1, 1).expand(logits.shape[0], -1, n_q, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    buffer = _state.capture
    buffer["sum"] = buffer.get("sum", 0) + probs.mean(dim=1)
    buffer["layers"] = buffer.get("layers", 0) + 1
    output = torch.matmul(probs.to(value.dtype), value)
    return output.transpose(1, 2).contiguous()


def _training_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rift_ada.attention import _base_function

    capture = getattr(_state, "capture", None)
    mask = getattr(_state, "mask", None)
    full = _is_full_attention(module, kwargs)
    scaling = kwargs.get("scaling") or module.scaling
    if capture is not None and full:
        return _scored_attention(module, query, key, value, scaling), None
    if mask is not None and full and getattr(module, "sinks", None) is None:
        n_q, n_k = query.shape[-2], key.shape[-2]
        visible = mask[:, None, n_k - n_q : n_k, :n_k].to(query.device)
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=visible, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
        )
        return output.transpose(1, 2).contiguous(), None
    if mask is not None and full:  # attention sinks (GPT-OSS): fold the mask into the model's own mask
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        additive = additive.masked_fill(~mask.to(query.device), torch.finfo(query.dtype).min)[:, None]
        return _base_function(module, "eager")(module, query, key, value, additive, *args, **kwargs)
    base = getattr(module, "_rift_train_base", "sdpa")
    if base == "sdpa":
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, *args, **kwargs)
    return _base_function(module, base)(module, query, key, value, attention_mask, *args, **kwargs)


def install_training_attention(model: Any) -> None:
    """Register ``rift-train-<base>`` and switch ``model`` (transformers, possibly peft-wrapped) to it.

    ``<base>`` is the model's own implementation (eager for GPT-OSS sinks, else sdpa); outside a
    :func:`masked` / :func:`capture_scores` block attention is exactly that implementation.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = inner.config._attn_implementation or "sdpa"
    if current.startswith(NAME):
        return
    base = "eager" if current == "eager" else "sdpa"
    name = f"{NAME}-{base}"
    AttentionInterface.register(name, _training_attention)
    AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[base])
    for module in inner.modules():
        if hasattr(module, "scaling"):
            module._rift_train_base = base
    inner.set_attn_implementation(name)


def restore_attention(model: Any) -> None:
    """Switch the model back to its own attention implementation (before saving it)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = inner.config._attn_implementation or ""
    if current.startswith(NAME):
        inner.set_attn_implementation(current.removeprefix(f"{NAME}-"))


@contextlib.contextmanager
def masked(mask: torch.Tensor | None) -> Iterator[None]:
    """Full-attention layers see only ``mask`` (batch, L, L; True = attend) inside the block."""
    _state.mask = mask
    try:
        yield
    finally:
        _state.mask = None


@contextlib.contextmanager
def capture_scores() -> Iterator[dict[str, Any]]:
    """Dense causal attention whose probabilities (mean over heads, summed over full-attention
    layers) accumulate in the yielded dict under ``sum`` (batch, L, L); ``layers`` counts them."""
    buffer: dict[str, Any] = {}
    _state.capture = buffer
    try:
        yield buffer
    finally:
        _state.capture = None
