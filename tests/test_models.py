"""Presets and loading: clear errors, and the embedded SmolLM2-135M really works."""

from __future__ import annotations

import pytest
import torch

from rift_ada.collectors.datasets import encode_prompt
from rift_ada.collectors.targets import generate_response
from rift_ada.models import PRESETS, ModelError, load_model, resolve_preset, smollm2_gguf_path


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ModelError, match="valid presets: qwen35-4b, qwen35-0.8b, llama31-8b"):
        resolve_preset("qwen-4b")


def test_presets_follow_the_paper_settings():
    assert PRESETS["qwen35-4b"].target == "Qwen/Qwen3.5-122B-A10B" and PRESETS["qwen35-4b"].budget == 8192
    assert (
        PRESETS["smollm2-135m"].self_speculation
        and PRESETS["smollm2-135m"].target_name == PRESETS["smollm2-135m"].draft
    )
    assert resolve_preset("org/some-model").self_speculation


def test_missing_hub_model_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelError, match="hf download"):
        load_model("nobody/not-a-cached-model")


def test_embedded_smollm2_loads_and_answers():
    assert smollm2_gguf_path().name.endswith(".gguf")
    model, tokenizer = load_model(PRESETS["smollm2-135m"].draft)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    answer = tokenizer.decode(generate_response(model, prompt, max_new_tokens=12))
    assert "Paris" in answer
