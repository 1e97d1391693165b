"""Gemma3: the budget on the full-attention layers only, the sliding layers at the model's own window.

Fast tests use a tiny random ``gemma3_text`` config (two sliding layers with window 8, two full
layers, separate RoPE bases, q/k norms with random weights, query_pre_attn_scalar != head_dim);
the ``slow`` ones use the embedded google/gemma-3-270m (converted once under $RIFT_ADA_CACHE).
"""

from __future__ import annotations

import json

import pytest
import torch
from gguf_tensors import read_gguf_tensors
from scipy.stats import chisquare
from tiny_models import VOCAB, tiny_model
from transformers import DynamicCache

from rift_ada.budget import make_policy
from rift_ada.cache import BudgetedLayer, make_draft_cache
from rift_ada.models import EMBEDDED, GEMMA3_PACKAGE, PRESETS, converted_model_dir, embedded_gguf_path, load_model
from rift_ada.speculative import BatchRequest, row_cache, speculative_generate, speculative_generate_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _greedy(model, prompt: list[int], n_tokens: int) -> list[int]:
    """The model's own greedy continuation (transformers' cache: its own sliding-window layers)."""
    cache = DynamicCache(config=model.config)
    out: list[int] = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        for _ in range(n_tokens):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return out


def _dense_logits(model, ids: torch.Tensor, prefill: int, visible) -> torch.Tensor:
    """Eager attention with explicit masks per layer type: full-attention layers causal in the
    prefill and ``visible(q, k)`` after it; sliding layers (q - window, q] throughout."""
    length = ids.shape[1]
    query = torch.arange(length)[:, None]
    key = torch.arange(length)[None, :]
    causal = key <= query
    window = model.config.sliding_window
    after = torch.tensor([[visible(q, k) for k in range(length)] for q in range(length)])
    full = causal & ((query < prefill) | after)
    sliding = causal & (key > query - window)
    masks = {
        name: torch.zeros(length, length).masked_fill(~mask, float("-inf"))[None, None]
        for name, mask in (("full_attention", full), ("sliding_attention", sliding))
    }
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return model(ids, attention_mask=masks).logits
    finally:
        model.set_attn_implementation(implementation)


def test_tiny_gemma3_budgets_the_full_layers_only():
    model = tiny_model("gemma3_text")
    cache = row_cache(model, make_policy("snapkv", budget=12, obs_window=4))
    assert cache.budgeted_indices == [1, 3] and cache.window_indices == [0, 2]
    assert all(cache.layers[index].policy.window == model.config.sliding_window for index in cache.window_indices)
    ids = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        model(torch.tensor([[5]]), position_ids=torch.tensor([[30]]), cache=cache, use_cache=True)
    for index in cache.budgeted_indices:
        assert [len(head) for head in cache.layers[index].working_set()] == [12]
    for index in cache.window_indices:
        assert cache.layers[index].working_set() == [list(range(31 - 8 + 1, 32))]
    summary = cache.query_summary()  # query drift: pre-RoPE queries of the full layers only
    assert len(summary) == 2 and len(summary[0]) == 1 and len(summary[0][0]) == model.config.head_dim


def test_tiny_gemma3_query_summary_is_the_normed_pre_rope_query_of_full_layers():
    """Query drift's input: the mean over a stride of q_norm(q_proj(x)) (before RoPE) per KV group,
    from the full-attention layers only (read here with hooks on the model's own q_norm)."""
    model = tiny_model("gemma3_text", seed=4)
    cache = row_cache(model, make_policy("rift-stat", budget=12, obs_window=4))
    captured: dict[int, list[torch.Tensor]] = {1: [], 3: []}
    handles = [
        model.model.layers[index].self_attn.q_norm.register_forward_hook(
            lambda module, args, output, index=index: captured[index].append(output.detach())
        )
        for index in captured
    ]
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(6))
    try:
        with torch.no_grad():
            model(ids[:, :20], cache=cache, use_cache=True)
            cache.query_summary()
            for values in captured.values():
                values.clear()
            for step in range(20, 24):
                model(ids[:, step : step + 1], position_ids=torch.tensor([[step]]), cache=cache, use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    summary = cache.query_summary()
    for layer, index in enumerate(captured):
        expected = torch.cat(captured[index], 2).mean((1, 2))[0]  # heads of the one KV group, 4 steps
        torch.testing.assert_close(torch.tensor(summary[layer][0]), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name,visible",
    [("swa", lambda q, k: k > q - 12), ("streamingllm", lambda q, k: k < 4 or k > q - 8)],
)
@pytest.mark.parametrize("own_windows", [False, True])
def test_tiny_gemma3_decode_matches_dense_masks(name, visible, own_windows):
    """Each decode step's logits equal full-sequence eager attention under per-layer-type masks
    (RoPE bases, q/k norms and query scaling all come from the model's own modules there)."""
    model = tiny_model("gemma3_text", seed=3)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    prefill = 16
    with torch.no_grad():
        reference = _dense_logits(model, ids, prefill, visible)
        cache = (row_cache if own_windows else make_draft_cache)(model, make_policy(name, budget=12, obs_window=4))
        got = [model(ids[:, :prefill], cache=cache, use_cache=True).logits]
        for step in range(prefill, ids.shape[1]):
            position = torch.tensor([[step]])
            got.append(model(ids[:, step : step + 1], position_ids=position, cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(got, 1), reference, atol=5e-5, rtol=1e-4)


def test_tiny_gemma3_t1_first_token_follows_the_model():
    """Self-speculation at T = 1 with a compressed draft (q != p): the committed token is distributed
    as the model's own p (chi-square over 300 seeded requests in one batch)."""
    model = tiny_model("gemma3_text", seed=21)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    policy = make_policy("swa", budget=4, obs_window=4)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        cache = make_draft_cache(model, policy)
        model(torch.tensor([prompt[:-1]]), cache=cache, use_cache=True)
        draft = model(torch.tensor([prompt[-1:]]), position_ids=torch.tensor([[39]]), cache=cache, use_cache=True)
        draft_probs = torch.softmax(draft.logits[0, -1].double(), -1)
    assert float((probs - draft_probs).abs().sum()) > 0.2  # the compressed draft really differs
    n_runs = 300
    requests = [BatchRequest(prompt, policy, max_new_tokens=1, seed=seed) for seed in range(n_runs)]
    results = speculative_generate_batch(model, requests, draft_length=1, temperature=1.0)
    counts = torch.bincount(torch.tensor([result.tokens[0] for result in results]), minlength=VOCAB).double()
    keep = probs > 0.02
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]]).numpy()
    expected = torch.cat([probs[keep], probs[~keep].sum()[None]]).numpy() * n_runs
    assert chisquare(observed, expected).pvalue > 1e-3
    wrong = torch.cat([draft_probs[keep], draft_probs[~keep].sum()[None]]).numpy()
    assert chisquare(observed, wrong * n_runs / wrong.sum()).pvalue < 1e-3


# ---- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    """(model, tokenizer, a ~700-token plain-text prompt) of the embedded Gemma3-270M."""
    import inspect

    import rift_ada.speculative

    model, tokenizer = load_model(PRESETS["gemma3-270m"].draft)
    prompt = tokenizer(inspect.getsource(rift_ada.speculative)).input_ids[:700]
    return model, tokenizer, prompt


@pytest.mark.slow
def test_converted_gemma3_equals_the_gguf_tensors():
    """The checkpoint (save_pretrained) holds the GGUF's de-quantised tensors, embedding included
    (Gemma's GGUF stores RMSNorm weights as 1 + w; transformers' norms scale by 1 + w)."""
    from safetensors import safe_open

    directory = converted_model_dir(PRESETS["gemma3-270m"].draft)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    for layer in (0, 5):  # a sliding and a full-attention layer: every tensor of each
        for gguf_name, name in {
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
            "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        }.items():  # fmt: skip
            names[f"blk.{layer}.{gguf_name}.weight"] = f"model.layers.{layer}.{name}.weight"
    expected = read_gguf_tensors(embedded_gguf_path(EMBEDDED[GEMMA3_PACKAGE]), list(names))
    with safe_open(str(directory / "model.safetensors"), "pt") as stored:
        assert len(list(stored.keys())) == 2 + 18 * 13  # no lm_head.weight: tied to the embedding
        for gguf_name, name in names.items():
            offset = 1.0 if gguf_name.endswith("norm.weight") else 0.0
            assert torch.equal(stored.get_tensor(name) + offset, expected[gguf_name]), name


@pytest.mark.slow
def test_real_gemma3_routing_budget_on_three_layers_window_on_fifteen(gemma):
    """What each layer's attention is handed at a decode step: B keys in the 3 full layers, exactly
    the model's 512-token window in the 15 sliding layers."""
    model, _, prompt = gemma
    assert model.config.layer_types.count("full_attention") == 3 and model.config.sliding_window == 512
    cache = row_cache(model, make_policy("snapkv", budget=128))
    assert cache.budgeted_indices == [5, 11, 17]
    assert cache.window_indices == [index for index in range(18) if index not in (5, 11, 17)]
    handed: dict[int, int] = {}
    originals = {}
    for index, layer in enumerate(cache.layers):
        assert isinstance(layer, BudgetedLayer)
        originals[index] = layer.update

        def update(key, value, *args, _index=index, **kwargs):
            keys, values = originals[_index](key, value, *args, **kwargs)
            handed[_index] = keys.shape[2]
            return keys, values

        layer.update = update
    with torch.no_grad():
        model(torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
        for step in range(3):
            position = torch.tensor([[len(prompt) + step]])
            model(torch.tensor([[prompt[step]]]), position_ids=position, cache=cache, use_cache=True)
            assert {index: handed[index] for index in (5, 11, 17)} == {5: 128, 11: 128, 17: 128}
            assert {handed[index] for index in cache.window_indices} == {512}
    position = len(prompt) + 3
    for index in cache.window_indices:
        assert cache.layers[index].working_set() == [list(range(position - 511, position + 1))]
    for index in cache.budgeted_indices:
        assert [len(head) for head in cache.layers[index].working_set()] == [128]


@pytest.mark.slow
def test_real_gemma3_t0_is_lossless(gemma):
    model, _, prompt = gemma
    expected = _greedy(model, prompt[:600], 16)
    policy = make_policy("snapkv", budget=96)
    result = speculative_generate(model, prompt[:600], policy=policy, max_new_tokens=16, draft_length=4)
    assert result.tokens == expected
    assert any(record.accepted < 4 for record in result.rounds[:-1])  # the budget made drafts miss


@pytest.mark.slow
def test_real_gemma3_batch_equals_each_request_alone(gemma):
    model, _, prompt = gemma
    requests = [
        BatchRequest(prompt[:300], make_policy("snapkv", budget=96), max_new_tokens=8, seed=1),
        BatchRequest(prompt[:250], make_policy("swa", budget=64), max_new_tokens=8, seed=2),
    ]
    batched = speculative_generate_batch(model, requests, draft_length=3, temperature=1.0)
    for request, got in zip(requests, batched, strict=True):
        alone = speculative_generate_batch(model, [request], draft_length=3, temperature=1.0)[0]
        assert got.tokens == alone.tokens
        assert [record.accepted for record in got.rounds] == [record.accepted for record in alone.rounds]
