"""Presets and loading: clear errors, and the embedded SmolLM2-135M really works."""

from __future__ import annotations

import json

import pytest
import torch
from gguf_tensors import read_gguf_tensors

from rift_ada.collectors.datasets import encode_prompt
from rift_ada.collectors.targets.generate import generate_response
from rift_ada.models import (
    CONVERSION_FILE,
    PRESETS,
    ModelError,
    converted_model_dir,
    is_current_conversion,
    load_model,
    load_tokenizer,
    resolve_preset,
    smollm2_gguf_path,
)


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


def test_converted_smollm2_is_a_faithful_checkpoint():
    """save_pretrained's layout: the tied embedding stored under the name every loader reads."""
    from safetensors import safe_open

    directory = converted_model_dir(PRESETS["smollm2-135m"].draft)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert is_current_conversion(directory)
    with safe_open(str(directory / "model.safetensors"), "pt") as stored:
        embedding = stored.get_tensor("model.embed_tokens.weight")
        value = stored.get_tensor("model.layers.3.self_attn.v_proj.weight")
    expected = read_gguf_tensors(smollm2_gguf_path(), ["token_embd.weight", "blk.3.attn_v.weight"])
    assert torch.equal(embedding, expected["token_embd.weight"])
    assert torch.equal(value, expected["blk.3.attn_v.weight"])


def test_an_old_conversion_is_upgraded_in_place(tmp_path, monkeypatch):
    """A cache written by safetensors.save_model (lm_head only, no marker) gains the embedding."""
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_model

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    old = tmp_path / "smollm2-135m"
    old.mkdir()
    model.config.save_pretrained(old)  # what rift-ada wrote before: no architectures, lm_head.weight only
    save_model(model, str(old / "model.safetensors"))
    load_tokenizer(PRESETS["smollm2-135m"].draft).save_pretrained(old)
    with safe_open(str(old / "model.safetensors"), "pt") as stored:
        assert "model.embed_tokens.weight" not in list(stored.keys())
        head = stored.get_tensor("lm_head.weight")
    monkeypatch.setenv("RIFT_ADA_CACHE", str(tmp_path))
    directory = converted_model_dir(PRESETS["smollm2-135m"].draft)
    assert directory == old and is_current_conversion(directory)
    assert json.loads((directory / CONVERSION_FILE).read_text())["upgraded_from"] == 1
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    with safe_open(str(directory / "model.safetensors"), "pt") as stored:
        assert torch.equal(stored.get_tensor("model.embed_tokens.weight"), head)
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".smollm2-135m.")
                and not path.name.endswith(".lock")]  # fmt: skip
