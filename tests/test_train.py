"""Compressibility training on tiny models: the attention hook, the loss, one optimizer step."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from rift_ada.collectors.pipeline import LoadedPair
from rift_ada.models import Preset
from rift_ada.train.attention import capture_scores, install_training_attention, masked
from rift_ada.train.config import TrainConfig
from rift_ada.train.data import Sample, split_requests
from rift_ada.train.losses import LossWeights, distillation_loss, kd_kl, skewed_teacher
from rift_ada.train.masks import compression_mask
from rift_ada.train.trainer import build_models, dense_pass, training_step_loss

pytest.importorskip("peft")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _pair(architecture: str) -> LoadedPair:
    preset = Preset("tiny", "tiny", None, 64, 0.0, architecture, "test")
    return LoadedPair(preset, tiny_model(architecture), None, None)


def _sample(length: int = 40, prompt: int = 24, seed: int = 0) -> Sample:
    ids = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Sample("s0", ids, prompt)


def _full_attention_layers(model) -> int:
    types = getattr(model.config, "layer_types", None)
    return model.config.num_hidden_layers if types is None else sum(t == "full_attention" for t in types)


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "gpt_oss", "nemotron_h"])
def test_hook_without_mask_or_with_causal_mask_is_the_plain_model(architecture):
    model = tiny_model(architecture)
    ids = torch.tensor([_sample().input_ids])
    reference = model(input_ids=ids, use_cache=False).logits
    install_training_attention(model)
    torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, reference)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()[None]
    with masked(causal):
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, reference, rtol=1e-4, atol=1e-4)
    with capture_scores() as buffer:
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, reference, rtol=1e-4, atol=1e-4)
    # Only full-attention layers reach the attention interface (Qwen3.5: DeltaNet layers do not).
    assert buffer["layers"] == _full_attention_layers(model)
    # A compression mask changes the masked (response) positions and nothing before them.
    scores = buffer["sum"][0] / buffer["layers"]
    mask = compression_mask(scores, 0.7, 0.25, first_masked=24)
    with masked(mask[None]):
        logits = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(logits[:, :24], reference[:, :24], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits[:, 30:], reference[:, 30:], atol=1e-3)


def test_captured_scores_are_the_mean_attention_probabilities():
    """Independent reference: transformers' eager attention with output_attentions=True."""
    model = tiny_model("llama")
    ids = torch.tensor([_sample().input_ids])
    model.set_attn_implementation("eager")
    attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    expected = torch.stack([a[0].mean(dim=0) for a in attentions]).sum(dim=0)
    install_training_attention(model)
    with capture_scores() as buffer:
        model(input_ids=ids, use_cache=False)
    torch.testing.assert_close(buffer["sum"][0], expected, rtol=1e-4, atol=1e-5)


def test_kd_loss_is_zero_when_student_equals_teacher():
    config = TrainConfig(mask="none", loss=LossWeights(ce=0.0, kd=1.0))
    models = build_models(config, _pair("llama"))  # LoRA starts as the identity: student == teacher
    losses, _ = training_step_loss(models, _sample(), config, torch.Generator().manual_seed(0))
    assert abs(float(losses["total"])) < 1e-6 and abs(float(losses["kd"])) < 1e-6
    # ... and not zero once the student sees a compressed cache.
    masked_config = TrainConfig(mask="attention", loss=LossWeights(ce=0.0, kd=1.0), p_values=(0.9,), p_probs=(1.0,))
    losses, _ = training_step_loss(models, _sample(), masked_config, torch.Generator().manual_seed(0))
    assert float(losses["kd"]) > 1e-4


def test_kl_and_skew_against_direct_formulas():
    student = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    teacher = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    t = 2.0
    p = torch.softmax(teacher / t, -1)
    q = torch.softmax(student / t, -1)
    expected = (p * (p.log() - q.log())).sum(-1).mean() * t * t
    torch.testing.assert_close(kd_kl(student, teacher, t), expected)
    torch.testing.assert_close(skewed_teacher(teacher, student, 0.5), 0.5 * teacher + 0.5 * student)
    labels = torch.tensor([0, 1, 2, 3, 4])
    terms = distillation_loss(student, teacher, labels, LossWeights(ce=0.25, kd=0.75, temperature=t))
    ce = torch.nn.functional.cross_entropy(student, labels)
    torch.testing.assert_close(terms["total"], 0.25 * ce + 0.75 * expected)
    with pytest.raises(ValueError, match="skew"):
        LossWeights(skew_alpha=1.5)


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5"])
@pytest.mark.parametrize("lora", [True, False])
def test_one_step_lowers_the_loss_on_a_fixed_batch(architecture, lora):
    config = TrainConfig(mask="attention", lora=lora, lora_rank=4, learning_rate=1e-2 if lora else 1e-3)
    pair = _pair(architecture)
    if architecture == "qwen3_5" or not lora:
        # External teacher: another tiny model of the same architecture (so KD has something to learn).
        pair.target = tiny_model(architecture, seed=1)
    models = build_models(config, pair)
    sample = _sample()
    params = [param for param in models.student.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    before, p = training_step_loss(models, sample, config, torch.Generator().manual_seed(5))
    before["total"].backward()
    optimizer.step()
    with torch.no_grad():
        after, p_again = training_step_loss(models, sample, config, torch.Generator().manual_seed(5))
    assert p_again == p
    assert float(after["total"]) < float(before["total"]) - 1e-4


def test_frozen_draft_is_the_initial_model_during_training():
    config = TrainConfig(mask="attention", lora=False)
    pair = _pair("llama")
    initial = copy.deepcopy(pair.draft)
    models = build_models(config, pair)
    with torch.no_grad():
        for param in models.student.parameters():
            param.add_(0.01)
    teacher_logits, scores = dense_pass(models, _sample(), want_scores=True)
    ids = torch.tensor([_sample().input_ids])
    expected = initial(input_ids=ids, use_cache=False).logits[0, 23:-1]
    torch.testing.assert_close(teacher_logits, expected, rtol=1e-4, atol=1e-4)
    assert scores is not None and scores.shape == (40, 40)


def test_split_is_seeded_and_disjoint():
    from rift_ada.collectors.datasets import Request

    requests = [Request(f"r{i}", "d", "c", "low", [{"role": "user", "content": "x"}]) for i in range(10)]
    train, held = split_requests(requests, 0.3, seed=4)
    assert len(held) == 3 and len(train) == 7
    assert not {r.request_id for r in train} & {r.request_id for r in held}
    again, _ = split_requests(requests, 0.3, seed=4)
    assert [r.request_id for r in again] == [r.request_id for r in train]
