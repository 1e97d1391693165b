"""The paper's other selectors (Expected Attention, CriticalKV, CurDKV, TriAttention) against
from-scratch references of their formulas, and inside the budgeted cache on every tiny architecture."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from rift_ada.budget import BudgetError, make_policy
from rift_ada.cache import _attention_modules, full_attention_layer_indices, make_draft_cache
from rift_ada.scorers import (
    SCORER_NAMES,
    CriticalKVScorer,
    CurDKVScorer,
    ExpectedAttentionScorer,
    ScoreInputs,
    SnapKVScorer,
    TriAttentionScorer,
)
from rift_ada.scorers.rope import find_rope
from rift_ada.speculative import speculative_generate

OTHERS = [name for name in SCORER_NAMES if name != "snapkv"]
HEADS, KV, DIM, WINDOW, N = 4, 2, 16, 6, 40  # the tiny models' attention shape


# ---- from-scratch references (float64 numpy, explicit loops) ---------------------------------
def _rope_matrix(position: float, theta: float) -> np.ndarray:
    """Rotate-half RoPE as a (d, d) matrix: channel i pairs with i + d/2 at frequency theta^(-2i/d)."""
    half = DIM // 2
    matrix = np.zeros((DIM, DIM))
    for i in range(half):
        angle = position * theta ** (-2.0 * i / DIM)
        c, s = math.cos(angle), math.sin(angle)
        matrix[i, i], matrix[i, i + half] = c, -s
        matrix[i + half, i], matrix[i + half, i + half] = s, c
    return matrix


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _keep_first(scores: np.ndarray, count: int) -> np.ndarray:
    for kv in range(scores.shape[0]):
        scores[kv, :count] = scores[kv].max() + 1
    return scores


def _ref_expected_attention(pre, positions, keys, values, scaling, theta, next_position, future, n_sink):
    out = np.zeros((KV, N))
    mean_rotation = sum(_rope_matrix(p, theta) for p in range(next_position, next_position + future)) / future
    for head in range(HEADS):
        kv = head // (HEADS // KV)
        rows = [pre[head, q] for q in range(WINDOW) if positions[q] >= n_sink]
        mu = sum(rows) / len(rows)
        cov = sum(np.outer(r - mu, r - mu) for r in rows) / len(rows)
        mu, cov = mean_rotation @ mu, mean_rotation @ cov @ mean_rotation.T
        logits = np.array(
            [scaling * mu @ keys[kv, j] + scaling**2 / 2 * keys[kv, j] @ cov @ keys[kv, j] for j in range(N)]
        )
        probs = np.zeros(N)
        probs[n_sink:] = _softmax(logits[n_sink:])
        out[kv] += probs / (HEADS // KV)
    out *= np.linalg.norm(values, axis=-1)
    return _keep_first(out, n_sink)


def _ref_snapkv(post, positions, keys, scaling, kernel):
    out = np.zeros((KV, N))
    for head in range(HEADS):
        kv = head // (HEADS // KV)
        for q in range(WINDOW):
            p = int(positions[q])
            weights = _softmax(np.array([scaling * post[head, q] @ keys[kv, j] for j in range(p + 1)]))
            out[kv, : p + 1] += weights / (HEADS // KV)
    half = kernel // 2
    return np.stack([[out[kv, max(0, j - half) : j + half + 1].max() for j in range(N)] for kv in range(KV)])


def _ref_criticalkv(base, values, weight, selected, candidates, ratio=0.5, eps=1e-4):
    group = HEADS // KV
    norms = np.zeros((KV, N))
    for head in range(HEADS):
        kv = head // group
        w_head = weight[:, head * DIM : (head + 1) * DIM]  # (hidden, dv): o_proj's columns of this head
        for j in range(N):
            norms[kv, j] += np.abs(w_head @ values[kv, j]).sum() / group
    out = (base + eps) * norms
    first = int(selected * ratio)
    for kv in range(KV):
        top = sorted(range(candidates), key=lambda j: (-base[kv, j], j))[:first]
        raised = out[kv].max() + 1
        out[kv, top] = raised
    return out


def _ref_curdkv(keys, values, window=16, n_sink=4):
    out = np.zeros((KV, N))
    for kv in range(KV):
        k2 = np.array([keys[kv, j] @ keys[kv, j] for j in range(N)])
        v2 = np.array([values[kv, j] @ values[kv, j] for j in range(N)])
        for start in range(0, N, window):
            block = slice(start, min(N, start + window))
            k2[block] /= k2[block].sum()
            v2[block] /= v2[block].sum()
        product = k2 * v2
        out[kv] = product / product.sum()
    return _keep_first(out, n_sink)


def _ref_triattention(pre, keys, scaling, theta, next_position, max_log2=16):
    group, half = HEADS // KV, DIM // 2
    offsets = [2**i for i in range(max_log2 + 1)]
    per_head = np.zeros((HEADS, N))
    for head in range(HEADS):
        kv = head // group
        centre = pre[head].mean(0)
        for j in range(N):
            trig = np.mean([(_rope_matrix(next_position - 1 + o, theta) @ centre) @ keys[kv, j] for o in offsets])
            norm = 0.0
            for f in range(half):  # rotation plane f: channels f and f + d/2
                plane = [f, f + half]
                spread = np.mean([np.linalg.norm(pre[head, q, plane]) for q in range(WINDOW)]) - np.linalg.norm(
                    centre[plane]
                )
                norm += spread * np.linalg.norm(keys[kv, j, plane])
            per_head[head, j] = scaling * (trig + norm)
    standard = (per_head - per_head.mean(1, keepdims=True)) / per_head.std(1, ddof=1, keepdims=True)
    return standard.reshape(KV, group, N).mean(1)


# ---- the scorers on the same tensors ---------------------------------------------------------
def _inputs(seed: int = 0):
    """Random pre-RoPE window queries, keys and values with a tiny Llama's RoPE and o_proj."""
    model = tiny_model("llama")
    attention = _attention_modules(model)[0]
    theta = float(model.config.rope_parameters["rope_theta"])
    generator = torch.Generator().manual_seed(seed)
    pre = torch.randn(1, HEADS, WINDOW, DIM, generator=generator) + 0.7  # a non-zero centre
    positions = torch.arange(N - WINDOW, N)
    post = torch.stack(
        [torch.from_numpy(_rope_matrix(float(p), theta)).float() @ pre[0, :, q].T for q, p in enumerate(positions)], 1
    ).permute(2, 1, 0)[None]  # (1, h, w, d)
    keys = torch.randn(1, KV, N, DIM, generator=generator)
    values = torch.randn(1, KV, N, DIM, generator=generator)
    scaling = DIM**-0.5
    snapkv = SnapKVScorer(obs_window=WINDOW, pool_kernel=7)
    inputs = ScoreInputs(
        keys=keys,
        values=values,
        queries=post,
        query_positions=positions,
        next_position=N,
        scaling=scaling,
        selected=10,
        candidates=N - WINDOW + 1,
        window_mass=lambda: snapkv.attention_mass(post, keys, positions, scaling),
        rope=find_rope(model, attention),
        output_weight=attention.o_proj.weight.detach(),
    )
    arrays = {
        name: t[0].double().numpy() for name, t in {"pre": pre, "post": post, "keys": keys, "values": values}.items()
    }
    return inputs, arrays, theta, snapkv


def test_pre_rope_queries_are_recovered():
    inputs, arrays, _, _ = _inputs()
    np.testing.assert_allclose(inputs.pre_rope_queries[0].double().numpy(), arrays["pre"], atol=1e-5)


def test_expected_attention_equals_from_scratch():
    inputs, a, theta, _ = _inputs(1)
    scorer = ExpectedAttentionScorer(n_future_positions=32)
    got = scorer.score(inputs)[0].double().numpy()
    expected = _ref_expected_attention(
        a["pre"], inputs.query_positions.numpy(), a["keys"], a["values"], inputs.scaling, theta, N, 32, 4
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_criticalkv_equals_from_scratch():
    inputs, a, _, snapkv = _inputs(2)
    got = CriticalKVScorer(base=snapkv).score(inputs)[0].double().numpy()
    base = _ref_snapkv(a["post"], inputs.query_positions.numpy(), a["keys"], inputs.scaling, 7) / WINDOW
    expected = _ref_criticalkv(base, a["values"], inputs.output_weight.double().numpy(), 10, inputs.candidates)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_curdkv_equals_from_scratch():
    inputs, a, _, _ = _inputs(3)
    got = CurDKVScorer().score(inputs)[0].double().numpy()
    np.testing.assert_allclose(got, _ref_curdkv(a["keys"], a["values"]), rtol=1e-5, atol=1e-8)


def test_triattention_equals_from_scratch():
    inputs, a, theta, _ = _inputs(4)
    got = TriAttentionScorer().score(inputs)[0].double().numpy()
    expected = _ref_triattention(a["pre"], a["keys"], inputs.scaling, theta, N)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("architecture", ["qwen3_5", "gpt_oss", "gemma3_text"])
def test_rope_rotation_inverts_itself_with_partial_and_scaled_rope(architecture):
    model = tiny_model(architecture)
    index = full_attention_layer_indices(model)[0]
    rope = find_rope(model, _attention_modules(model)[index])
    x = torch.randn(1, 2, 5, DIM, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(100, 105)
    rotated = rope.rotate(x, positions)
    assert not torch.allclose(rotated, x)
    torch.testing.assert_close(rope.rotate(rotated, positions, inverse=True), x, atol=1e-5, rtol=1e-5)
    mean = rope.mean_rotation(positions, DIM, x.device)
    at_each = rope.rotate(x[:, :, :1].expand(-1, -1, 5, -1), positions)  # one vector moved to every position
    torch.testing.assert_close(x[:, :, 0] @ mean.T, at_each.mean(2), atol=1e-5, rtol=1e-5)


# ---- inside the cache ------------------------------------------------------------------------
def test_policy_validates_the_scorer_name():
    with pytest.raises(BudgetError, match="unknown scorer 'nope'.*valid scorers: snapkv, expected-attention"):
        make_policy("rift-stat", budget=32, scorer="nope")
    with pytest.raises(BudgetError, match="needs a prefill-scored policy"):
        make_policy("h2o", budget=32, scorer="curdkv")
    assert make_policy("snapkv", budget=96, scorer="triattention").scorer == "triattention"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("scorer", OTHERS)
def test_selection_stays_within_the_budget(architecture, scorer):
    """Window + k positions per KV head at every step, token and block level, refreshed or not."""
    model = tiny_model(architecture)
    budget = 24
    ids = torch.randint(0, VOCAB, (1, 90), generator=torch.Generator().manual_seed(4))
    for name, block in (("snapkv", None), ("rift-stat", 4), ("rift-dyn", None)):
        cache = make_draft_cache(model, make_policy(name, budget=budget, obs_window=8, block_size=block, scorer=scorer))
        with torch.no_grad():
            model(ids[:, :40], cache=cache, use_cache=True)
            for step in range(40, 90):
                model(ids[:, step : step + 1], cache=cache, use_cache=True)
                if name == "rift-dyn" and step % 13 == 0:
                    cache.refresh()
                for layer in cache.budgeted_layers:
                    for head in layer.working_set():
                        assert len(head) == min(budget, step + 2), f"{architecture}/{scorer}/{name}"
                        assert len(set(head)) == len(head) and max(head) == step + 1


def test_each_scorer_chooses_its_own_selection():
    model = tiny_model("llama")
    ids = torch.randint(0, VOCAB, (1, 80), generator=torch.Generator().manual_seed(6))
    selections = {}
    for scorer in SCORER_NAMES:
        cache = make_draft_cache(model, make_policy("rift-stat", budget=24, obs_window=8, scorer=scorer))
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
        selections[scorer] = [layer.compute_selection().tolist() for layer in cache.budgeted_layers]
    for scorer in OTHERS:
        assert selections[scorer] != selections["snapkv"], scorer


def _greedy(model, prompt, n_tokens):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
        for _ in range(n_tokens):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return out


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "gpt_oss", "nemotron_h"])
def test_t0_speculative_decoding_is_lossless_with_every_scorer(architecture):
    model = tiny_model(architecture, seed=11)
    prompt = torch.randint(0, VOCAB, (50,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = _greedy(model, prompt, 30)
    for scorer in OTHERS:
        policy = make_policy("rift-dyn", budget=16, obs_window=8, refresh_interval=8, scorer=scorer)
        result = speculative_generate(model, prompt, policy=policy, max_new_tokens=30, draft_length=5)
        assert result.tokens == expected, f"{architecture}/{scorer}"
        assert result.refreshes >= 2


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5"])
def test_a_batch_of_requests_with_different_scorers_equals_each_alone(architecture):
    from rift_ada.speculative import BatchRequest, PeriodicRefresh, speculative_generate_batch

    model = tiny_model(architecture, seed=7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (44, 37)]
    requests = [
        BatchRequest(
            prompts[index % 2],
            make_policy("rift-stat", budget=16, obs_window=8, scorer=scorer),
            max_new_tokens=20,
            refresh_hook=PeriodicRefresh(6 + index),
        )
        for index, scorer in enumerate(SCORER_NAMES)
    ]
    batched = speculative_generate_batch(model, requests, draft_length=4)
    for request, got in zip(requests, batched, strict=True):
        alone = speculative_generate(
            model,
            request.prompt_ids,
            policy=request.policy,
            max_new_tokens=20,
            refresh_hook=PeriodicRefresh(request.refresh_hook.interval),
            draft_length=4,
        )
        assert got.tokens == alone.tokens, request.policy.scorer
        assert [r.accepted for r in got.rounds] == [r.accepted for r in alone.rounds], request.policy.scorer


@pytest.mark.parametrize("scorer", ["expected-attention", "criticalkv", "triattention"])
def test_probe_arms_rescore_with_the_policys_scorer(scorer):
    """The age:0 arm equals one budgeted draft refreshed (with the same scorer) before every stride."""
    from rift_ada.collectors.probe import probe_request

    model = tiny_model("llama", seed=3)
    prompt = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(11)).tolist()
    response = speculative_generate(model, prompt, policy=make_policy("full"), max_new_tokens=48).tokens
    policy = make_policy("rift-stat", budget=32, obs_window=8, scorer=scorer)
    probed = probe_request(model, prompt, response, policy=policy, temperature=0.0, arm_ages=(0,))
    cache = make_draft_cache(model, policy)
    sequence = torch.tensor([prompt + response])
    start = len(prompt) - 1
    matches: list[float] = []
    with torch.no_grad():
        model(input_ids=sequence[:, :start], cache=cache, use_cache=True)
        for first in range(0, len(response), 8):
            if first:
                cache.refresh()
            expected = response[first : first + 8]
            tokens = sequence[:, start + first : start + first + len(expected)]
            positions = torch.arange(start + first, start + first + len(expected))[None]
            logits = model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True).logits[0]
            matches += (logits.argmax(-1) == torch.tensor(expected)).float().tolist()
    np.testing.assert_array_equal(probed.outcome[probed.arms.index("age:0")], np.array(matches, dtype=np.float32))


def test_criticalkv_reuses_norms_only_of_unchanged_values():
    inputs, _, _, snapkv = _inputs(5)
    scorer = CriticalKVScorer(base=snapkv)
    scorer.score(inputs)
    values = inputs.values.clone()
    values[:, :, 30] += 1.0  # a position rewritten (a rollback went below it)
    changed = dataclasses.replace(inputs, values=values)
    torch.testing.assert_close(scorer.score(changed), CriticalKVScorer(base=snapkv).score(changed))
    assert not torch.allclose(scorer.score(changed), CriticalKVScorer(base=snapkv).score(inputs))


def test_triattention_closed_policy_is_a_decode_time_baseline():
    """``triattention``: TriAttention scores the SnapKV-shaped selection, rescored every 128 tokens."""
    from rift_ada.collectors.collect import TRIATTENTION_INTERVAL, CollectSettings, resolve_closed_policy
    from rift_ada.hooks import ControllerRefresh

    settings = CollectSettings(draft="tiny", target="tiny", budget=96)
    closed = resolve_closed_policy("triattention", settings)
    assert (closed.cache.name, closed.cache.scorer, closed.cache.window) == ("snapkv", "triattention", 64)
    assert closed.controller["policy"] == {"kind": "periodic", "interval": TRIATTENTION_INTERVAL}
    assert closed.controller["cache"]["scorer"] == "triattention"
    model = tiny_model("llama", seed=11)
    prompt = torch.randint(0, VOCAB, (120,), generator=torch.Generator().manual_seed(3)).tolist()
    from rift_ada.controller import Controller

    hook = ControllerRefresh(Controller.from_dict(closed.controller))
    result = speculative_generate(model, prompt, policy=closed.cache, max_new_tokens=300, refresh_hook=hook)
    assert result.tokens == _greedy(model, prompt, 300)
    assert result.refreshes == 2  # at 128 and 256 committed tokens
