"""The budgeted draft cache: equivalence with the plain model, working-set sizes, hybrid layers."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import ARCHITECTURES, VOCAB, tiny_config, tiny_model
from transformers import DynamicCache

from rift_ada.budget import POLICY_NAMES, BudgetError, make_policy
from rift_ada.cache import BudgetedLayer, CacheError, gather_positions, make_draft_cache


def _decode(model, cache, ids, prefill):
    logits = [model(ids[:, :prefill], cache=cache, use_cache=True).logits]
    for step in range(prefill, ids.shape[1]):
        logits.append(model(ids[:, step : step + 1], cache=cache, use_cache=True).logits)
    return torch.cat(logits, 1)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_budget_covering_sequence_gives_plain_logits(architecture):
    model = tiny_model(architecture)
    ids = torch.randint(0, VOCAB, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids).logits
        for name in POLICY_NAMES:
            cache = make_draft_cache(model, make_policy(name, budget=64, obs_window=8))
            got = _decode(model, cache, ids, 24)
            torch.testing.assert_close(got, reference, atol=2e-5, rtol=1e-5, msg=f"{architecture}/{name}")


def _dense_reference(model, ids, prefill, visible):
    """Logits with an explicit additive mask: full causal in the prefill, `visible(q, k)` after it."""
    length = ids.shape[1]
    mask = torch.full((length, length), float("-inf"))
    for query in range(length):
        for key in range(query + 1):
            if query < prefill or visible(query, key):
                mask[query, key] = 0.0
    model.set_attn_implementation("eager")
    try:
        return model(ids, attention_mask=mask[None, None]).logits
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize(
    "name,visible",
    [
        ("swa", lambda q, k: k > q - 16),
        ("streamingllm", lambda q, k: k < 4 or k > q - 12),
    ],
)
def test_window_policies_match_dense_mask_attention(name, visible):
    model = tiny_model("llama", seed=3)
    ids = torch.randint(0, VOCAB, (1, 56), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = _dense_reference(model, ids, 20, visible)
        cache = make_draft_cache(model, make_policy(name, budget=16, obs_window=8))
        got = _decode(model, cache, ids, 20)
    torch.testing.assert_close(got, reference, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["swa", "streamingllm", "h2o", "snapkv", "rift-stat", "rift-dyn"])
def test_working_set_is_min_budget_length(name):
    model = tiny_model("qwen3")
    budget = 24
    ids = torch.randint(0, VOCAB, (1, 230), generator=torch.Generator().manual_seed(4))
    cache = make_draft_cache(model, make_policy(name, budget=budget, obs_window=8, block_size=None))
    with torch.no_grad():
        model(ids[:, :30], cache=cache, use_cache=True)
        for step in range(30, 230):
            model(ids[:, step : step + 1], cache=cache, use_cache=True)
            if name == "rift-dyn" and step % 17 == 0:
                cache.refresh()
            for layer in cache.budgeted_layers:
                for head in layer.working_set():
                    assert len(head) == min(budget, step + 2)
                    assert len(set(head)) == len(head) and max(head) == step + 1


def test_short_prompt_working_set_grows_to_budget():
    model = tiny_model("llama")
    cache = make_draft_cache(model, make_policy("rift-stat", budget=32, obs_window=8))
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model(ids[:, :10], cache=cache, use_cache=True)
        for step in range(10, 60):
            model(ids[:, step : step + 1], cache=cache, use_cache=True)
            sizes = {len(head) for layer in cache.budgeted_layers for head in layer.working_set()}
            assert sizes == {min(32, step + 2)}


@pytest.mark.parametrize("architecture", ["qwen3_5", "nemotron_h", "gpt_oss"])
def test_untouched_layers_are_bit_identical(architecture):
    model = tiny_model(architecture)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(6))
    plain = DynamicCache(config=model.config)
    budgeted = make_draft_cache(model, make_policy("full"))
    small = make_draft_cache(model, make_policy("rift-stat", budget=16, obs_window=8))
    with torch.no_grad():
        _decode(model, plain, ids, 20)
        _decode(model, budgeted, ids, 20)
        _decode(model, small, ids, 20)
    first_budgeted = min(budgeted.budgeted_indices)
    for index, layer in enumerate(plain.layers):
        if index in budgeted.budgeted_indices:
            assert isinstance(budgeted.layers[index], BudgetedLayer)
            continue
        assert type(budgeted.layers[index]) is type(layer)
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, getattr(budgeted.layers[index], name)), (index, name)
                if index < first_budgeted:  # upstream of every budgeted layer: unaffected by the budget
                    assert torch.equal(value, getattr(small.layers[index], name)), (index, name)
            elif isinstance(value, dict):
                for key, tensor in value.items():
                    if isinstance(tensor, torch.Tensor):
                        assert torch.equal(tensor, getattr(budgeted.layers[index], name)[key]), (index, name, key)


def test_refresh_rescores_with_latest_queries():
    model = tiny_model("llama", seed=7)
    cache = make_draft_cache(model, make_policy("rift-dyn", budget=24, obs_window=8, refresh_interval=8))
    ids = torch.randint(0, VOCAB, (1, 120), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        model(ids[:, :60], cache=cache, use_cache=True)
        model(ids[:, 60:61], cache=cache, use_cache=True)
        before = cache.budgeted_layers[0].selection.clone()
        for step in range(61, 120):
            model(ids[:, step : step + 1], cache=cache, use_cache=True)
        layer = cache.budgeted_layers[0]
        assert torch.equal(layer.query_positions, torch.arange(112, 120))
        cache.refresh()
        after = layer.selection
    assert after.shape == before.shape
    assert int(after.max()) <= 120 - layer.window  # outside the window of the next query
    assert int(after.max()) > 60 - layer.window  # decode positions are candidates now


def test_a_prefill_leaves_only_its_query_window_in_memory():
    """After a prefill longer than the query window a layer holds that window's queries alone, not the
    whole prompt's (a slice of the prefill's queries kept all of them alive, and deep copies copied them)."""
    model = tiny_model("llama", seed=7)
    cache = make_draft_cache(model, make_policy("rift-stat", budget=24, obs_window=8))
    ids = torch.randint(0, VOCAB, (1, 120), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    for layer in cache.budgeted_layers:
        buffer = layer.query_buffer
        assert buffer.shape[2] == 8 and torch.equal(layer.query_positions, torch.arange(112, 120))
        assert buffer.untyped_storage().nbytes() == buffer.numel() * buffer.element_size()
        assert buffer.stride() == buffer.transpose(1, 2).contiguous().transpose(1, 2).stride()  # the layout it had


def test_a_window_scored_whole_keeps_its_blocks_and_a_copy_rescores_only_the_new_one(monkeypatch):
    """With `rescore_block`, a layer's first rescoring scores its query window in one product, giving the selection
    of a layer without blocks bit for bit, and keeps the window's blocks; a copy of it (the probe's arms cache) that
    rescores a block later scores only the new block, and its window mass is the whole window's scored afresh."""
    from rift_ada.scorers import SnapKVScorer

    model = tiny_model("llama", seed=7)
    policy = make_policy("rift-stat", budget=24, obs_window=8)
    ids = torch.randint(0, VOCAB, (1, 124), generator=torch.Generator().manual_seed(8))
    plain, blocked = make_draft_cache(model, policy), make_draft_cache(model, policy)
    with torch.no_grad():
        for cache in (plain, blocked):
            model(ids[:, :120], cache=cache, use_cache=True)
    for layer in blocked.budgeted_layers:
        layer.rescore_block = 4
    for whole, kept in zip(plain.budgeted_layers, blocked.budgeted_layers, strict=True):
        assert torch.equal(whole.compute_selection(), kept.compute_selection())
    copied = copy.deepcopy(blocked)
    with torch.no_grad():
        for cache in (plain, copied):
            model(ids[:, 120:124], cache=cache, use_cache=True)
    scored = []
    original = SnapKVScorer.attention_probs

    def counted(self, queries, *args, **kwargs):
        scored.append(queries.shape[2])
        return original(self, queries, *args, **kwargs)

    monkeypatch.setattr(SnapKVScorer, "attention_probs", counted)
    masses = [
        (whole.score_inputs().window_mass(), kept.score_inputs().window_mass())
        for whole, kept in zip(plain.budgeted_layers, copied.budgeted_layers, strict=True)
    ]
    assert scored == [8, 4] * len(masses)  # the plain layer's whole window, the copy's new block
    monkeypatch.undo()
    for (fresh, reused), kept in zip(masses, copied.budgeted_layers, strict=True):
        assert torch.equal(kept.query_positions, torch.arange(116, 124))
        torch.testing.assert_close(reused, fresh)
        newest = kept._mass.attention_mass(kept.query_buffer[:, :, 4:], kept.stored_keys(), torch.arange(120, 124),
                                           kept.scaling)  # fmt: skip
        assert not torch.allclose(reused, newest)  # the kept block counts


def test_gather_positions_is_torch_gather_along_positions():
    """The working sets' row-wise gather equals torch.gather's, for stored KV that is a view of a larger buffer or
    not contiguous, into a new tensor or into a slice of a stacked buffer."""
    generator = torch.Generator().manual_seed(3)
    buffer = torch.randn(5, 3, 40, 8, generator=generator)
    positions = torch.randint(0, 30, (2, 3, 11), generator=generator)
    for stored in (buffer[1:3], buffer[1:3, :, :30], buffer[1:3].transpose(0, 1).contiguous().transpose(0, 1)):
        expected = torch.gather(stored, 2, positions[..., None].expand(-1, -1, -1, 8))
        assert torch.equal(gather_positions(stored, positions), expected)
        stacked = torch.zeros(4, 3, 14, 8)
        gather_positions(stored, positions, out=stacked[1:3, :, :11])  # not contiguous: copied in
        assert torch.equal(stacked[1:3, :, :11], expected) and not stacked[1:3, :, 11:].any() and not stacked[0].any()
        whole = torch.zeros(4, 3, 11, 8)
        gather_positions(stored, positions, out=whole[2:4])  # contiguous: written in place
        assert torch.equal(whole[2:4], expected) and not whole[:2].any()


def test_bad_input_errors_are_clear():
    with pytest.raises(BudgetError, match="valid policies: full, swa"):
        make_policy("snapkv2")
    with pytest.raises(BudgetError, match="sw_ratio"):
        make_policy("rift-stat", budget=128, sw_ratio=1.5)
    with pytest.raises(BudgetError, match="sw_ratio"):
        make_policy("rift-stat", budget=128, sw_ratio=0.0)
    with pytest.raises(BudgetError, match="observation window"):
        make_policy("rift-stat", budget=32, obs_window=64)
    import transformers

    config = tiny_config("nemotron_h", hybrid_override_pattern="M-M-")  # Mamba and MLP layers only
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(CacheError, match="no full-attention layers"):
        make_draft_cache(model, make_policy("rift-stat", budget=64, obs_window=8))


def test_a_ring_rebuilt_before_a_step_is_the_ring_the_step_would_build():
    """After a refresh, `rebuild_ring_in` (what a batch does to keep a step batched) gives the same
    [selection | window ring] and logits as the step rebuilding the ring itself, in the buffer given."""
    model = tiny_model("llama", seed=7)
    ids = torch.randint(0, VOCAB, (1, 101), generator=torch.Generator().manual_seed(9))
    rebuilt = make_draft_cache(model, make_policy("rift-dyn", budget=24, obs_window=8, refresh_interval=8))
    with torch.no_grad():
        model(ids[:, :60], cache=rebuilt, use_cache=True)
        for step in range(60, 100):
            model(ids[:, step : step + 1], cache=rebuilt, use_cache=True)
        rebuilt.refresh()
        itself = copy.deepcopy(rebuilt)
        buffers = []
        for layer in rebuilt.budgeted_layers:
            width = layer.selection.shape[-1] + layer.window
            keys = layer.keys.new_full((1, layer.keys.shape[1], width, layer.keys.shape[3]), float("nan"))
            values = layer.values.new_full((1, layer.values.shape[1], width, layer.values.shape[3]), float("nan"))
            assert layer.ring_step_slot() is None  # the refresh made the ring stale
            assert layer.rebuild_ring_in(keys, values)
            assert layer.ring_step_slot() is not None
            buffers.append(keys)
        logits = model(ids[:, 100:], cache=rebuilt, use_cache=True).logits
        reference = model(ids[:, 100:], cache=itself, use_cache=True).logits
    assert torch.equal(logits, reference)
    for layer, other, keys in zip(rebuilt.budgeted_layers, itself.budgeted_layers, buffers, strict=True):
        assert layer.ring_keys() is keys  # the step wrote into the buffer given, it did not rebuild
        assert torch.equal(layer.ring_keys(), other.ring_keys())
        assert torch.equal(layer._ring[2], other._ring[2])
