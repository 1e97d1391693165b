"""The probe with requests batched as well as arms: each request gets what it gets probed alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_models import VOCAB, tiny_model

from rift_ada.batch_cache import StackedArmsCache
from rift_ada.budget import make_policy
from rift_ada.collectors.probe import ProbeError, _arms_forward, _RequestProbe, probe_request, probe_requests
from rift_ada.speculative import speculative_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ARM_AGES = (0, 8, 16, 32, 64)


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _requests(model: torch.nn.Module) -> list[tuple[list[int], list[int]]]:
    """Mixed prompts (one shorter than the window, so its arms' working sets are narrower early on) and
    mixed responses: partial last strides of different lengths, and a response too short for the
    older arms (so the requests run different numbers of arms)."""
    full = make_policy("full")
    requests = []
    for seed, (prompt_length, response_length) in enumerate([(44, 61), (6, 40), (70, 21), (30, 56), (52, 9)]):
        prompt = _prompt(100 + seed, prompt_length)
        response = speculative_generate(model, prompt, policy=full, max_new_tokens=response_length, seed=seed).tokens
        requests.append((prompt, response[:response_length]))
    return requests


def _assert_same(got, alone, exact: bool, label: str) -> None:
    assert got.arms == alone.arms, label
    for name in ("outcome", "entropy", "query_drift", "retained_mass", "token_acceptance"):
        a, b = getattr(got, name), getattr(alone, name)
        if a is None or b is None:
            assert a is None and b is None, (label, name)
        elif exact or name == "outcome" and got.token_acceptance is None:  # T = 0 outcomes: greedy agreement
            np.testing.assert_array_equal(a, b, err_msg=f"{label} {name}")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=f"{label} {name}")


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "nemotron_h", "gpt_oss", "gemma3_text"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_request_of_a_batch_gets_what_it_gets_alone(architecture: str, temperature: float):
    """Batches of 3 and of all 5 requests (so requests leave and others join mid-run) against each
    request probed alone: every array of every request, outcomes exactly at T = 0."""
    model = tiny_model(architecture, seed=5)
    requests = _requests(model)
    policy = make_policy("rift-stat", budget=16, obs_window=8)
    settings = dict(policy=policy, temperature=temperature, arm_ages=ARM_AGES)
    alone = [probe_request(model, prompt, response, **settings) for prompt, response in requests]
    assert len({len(result.arms) for result in alone}) == 1  # requested arms; the ones run differ (see _requests)
    for batch_size in (3, 5):
        results = list(probe_requests(model, requests, batch_size=batch_size, **settings))
        finished = [index for index, _ in results]
        assert sorted(finished) == list(range(len(requests)))
        assert finished != list(range(len(requests)))  # short requests finish first: results come as they end
        for index, result in results:
            label = f"{architecture} T={temperature} batch {batch_size} request {index}"
            _assert_same(result, alone[index], exact=False, label=label)


@torch.no_grad()
def test_stacked_arms_forward_leaves_each_request_as_its_own_forward_would():
    """Stacking two requests' arms caches for one forward: each member's stored KV, length and
    recurrent state end exactly where its own forward leaves them (qwen3_5: Gated DeltaNet states).
    At the third stride the arms that refreshed have parted from stat's row: 3 rows each."""
    model = tiny_model("qwen3_5", seed=2)
    requests = _requests(model)[:2]
    policy = make_policy("rift-stat", budget=16, obs_window=8)
    settings = dict(policy=policy, temperature=0.0, arm_ages=ARM_AGES, decision_stride=8, target_model=None)
    probes = [_RequestProbe(model, list(p), list(r), **settings) for p, r in requests]
    for probe in probes:
        for _ in range(2):
            probe.prepare()
            probe.finish(_arms_forward(model, [probe])[0])
        probe.prepare()
    assert [probe.rows for probe in probes] == [3, 3]
    own = [copy.deepcopy(probe.arms_cache) for probe in probes]
    own_logits = [
        model(
            input_ids=probe.tokens.expand(probe.rows, -1),
            position_ids=(probe.position + torch.arange(8))[None].expand(probe.rows, -1),
            cache=cache,
            use_cache=True,
        ).logits
        for probe, cache in zip(probes, own, strict=True)
    ]
    stacked = StackedArmsCache([probe.arms_cache for probe in probes])
    tokens = torch.cat([probe.tokens.expand(probe.rows, -1) for probe in probes])
    positions = torch.cat([(probe.position + torch.arange(8))[None].expand(probe.rows, -1) for probe in probes])
    logits = model(input_ids=tokens, position_ids=positions, cache=stacked, use_cache=True).logits
    stacked.split()
    for probe, cache, expected in zip(probes, own, own_logits, strict=True):
        got = logits[: probe.rows]
        logits = logits[probe.rows :]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(probe.arms_cache.layers, cache.layers, strict=True):
            if hasattr(mine, "length"):
                assert mine.length == theirs.length
                torch.testing.assert_close(mine.stored_keys(), theirs.stored_keys(), rtol=1e-4, atol=1e-5)
            else:
                for state, reference in zip(
                    mine.recurrent_states.values(), theirs.recurrent_states.values(), strict=True
                ):
                    assert state.shape == reference.shape and state.shape[0] == probe.rows
                    torch.testing.assert_close(state, reference, rtol=1e-4, atol=1e-5)
                for state, reference in zip(mine.conv_states.values(), theirs.conv_states.values(), strict=True):
                    torch.testing.assert_close(state, reference, rtol=1e-4, atol=1e-5)


def test_bad_request_is_refused_before_any_forward():
    model = tiny_model("llama", seed=1)
    good = (_prompt(1, 20), _prompt(2, 16))
    policy = make_policy("rift-stat", budget=16, obs_window=8)
    with pytest.raises(ProbeError, match="non-empty response"):
        list(probe_requests(model, [good, (_prompt(3, 20), [])], policy=policy, batch_size=2))
    with pytest.raises(ProbeError, match="batch_size"):
        list(probe_requests(model, [good], policy=policy, batch_size=0))
    with pytest.raises(ProbeError, match="policy: probe arms cannot follow 'h2o'"):  # was an IndexError mid-probe
        list(probe_requests(model, [good], policy=make_policy("h2o", budget=16, obs_window=8)))


def test_batched_collection_writes_the_traces_of_one_request_at_a_time(tmp_path):
    """`collect_probe(batch_size=3)` writes each request's traces under its own id as it ends (the
    short ones first): the trace directory reads back as the one-at-a-time collection's."""
    from rift_ada.collectors.collect import CollectSettings, collect_probe
    from rift_ada.collectors.datasets import Request
    from rift_ada.collectors.trace_io import read_probe_traces

    model = tiny_model("llama", seed=4)
    settings = CollectSettings(draft="tiny", target="tiny", budget=16, obs_window=8, arm_ages=(0, 8, 16))
    requests, targets = [], []
    for index, (prompt_length, response_length) in enumerate([(40, 30), (12, 9), (33, 21), (25, 16)]):
        requests.append(Request(f"r{index}", "synthetic", "cat", "low", [{"role": "user", "content": "x"}]))
        targets.append(
            {
                "request_id": f"r{index}",
                "prompt_token_ids": _prompt(200 + index, prompt_length),
                "response_token_ids": _prompt(300 + index, response_length),
            }
        )
    ended: list[str] = []
    collect_probe(model, requests, targets, tmp_path / "one", settings)
    summary = collect_probe(
        model,
        requests,
        targets,
        tmp_path / "batched",
        settings,
        batch_size=3,
        on_request=lambda rid, _: ended.append(rid),
    )
    assert summary.collected == 4 and ended[0] == "r1" and sorted(ended) == ["r0", "r1", "r2", "r3"]
    one, batched = read_probe_traces(tmp_path / "one"), read_probe_traces(tmp_path / "batched")
    assert list(one.requests["request_id"]) == list(batched.requests["request_id"])
    np.testing.assert_array_equal(one.outcome, batched.outcome)  # T = 0: greedy agreement
    np.testing.assert_allclose(one.entropy, batched.entropy, rtol=1e-4, atol=1e-5, equal_nan=True)
    for name, values in one.stride_signals.items():
        np.testing.assert_allclose(values, batched.stride_signals[name], rtol=1e-4, atol=1e-5, equal_nan=True)


def test_arms_with_one_history_share_a_row_until_they_refresh():
    """Arms whose working sets have been alike at every stride share one row of the arms' forward: all
    of them at the first stride, ``age:N`` with ``stat`` until it first reads its own refresh (stride
    N / 8 + 1). The rows run are counted from that rule, and a sharing arm's values are stat's, bit
    for bit (an arm in its own row would differ from stat in the last bits at most, since its history
    is stat's). Each arm's values against a per-arm reference cache: test_collect.py (age arms)."""
    model = tiny_model("llama", seed=3)
    prompt = _prompt(11, 64)
    response = speculative_generate(model, prompt, policy=make_policy("full"), max_new_tokens=80).tokens[:80]
    ages = (0, 16, 32, 64)
    policy = make_policy("rift-stat", budget=32, obs_window=8)
    probed = probe_request(model, prompt, response, policy=policy, temperature=1.0, arm_ages=ages)
    n_strides = 10
    assert probed.arm_rows_run == sum(1 + sum(age // 8 < stride for age in ages) for stride in range(n_strides))
    stat = probed.arms.index("stat")
    for age in ages:
        arm = probed.arms.index(f"age:{age}")
        shared = (age // 8 + 1) * 8  # positions before its first own refresh
        for name in ("outcome", "entropy", "token_acceptance"):
            values = getattr(probed, name)
            np.testing.assert_array_equal(values[arm, :shared], values[stat, :shared], err_msg=f"age:{age} {name}")
            assert not np.array_equal(values[arm, shared:], values[stat, shared:]), (age, name)


@torch.no_grad()
def test_arms_part_by_copying_rows_within_the_reserved_buffers():
    """The arms cache's KV is allocated for every compressed arm at set-up; as arms part, the rows in use grow
    inside it (no new tensor a stride) and a new row starts as a copy of the row it parts from."""
    model = tiny_model("llama", seed=3)
    prompt = _prompt(11, 64)
    response = speculative_generate(model, prompt, policy=make_policy("full"), max_new_tokens=40).tokens[:40]
    policy = make_policy("rift-stat", budget=32, obs_window=8)
    probe = _RequestProbe(
        model, prompt, response, policy=policy, temperature=0.0, arm_ages=(0, 8, 16), decision_stride=8,
        target_model=None,
    )  # fmt: skip
    layer = probe.arm_layers[0]
    buffer = layer.arm_buffers[0]
    assert buffer.shape[0] == probe.compressed == 4 and layer.keys.shape[0] == 1
    rows_seen = []
    while not probe.done:
        before = layer.keys.clone()
        probe.prepare()
        rows_seen.append(probe.rows)
        assert layer.keys.data_ptr() == buffer.data_ptr() and layer.keys.shape[0] == probe.rows
        for row in range(before.shape[0], probe.rows):  # a new row: its parent's stored KV (rows are by first arm)
            torch.testing.assert_close(layer.keys[row], before[before.shape[0] - 1], rtol=0, atol=0)
        probe.finish(_arms_forward(model, [probe])[0])
    assert rows_seen == [1, 2, 3, 4, 4]


def test_requests_join_only_while_the_position_budget_holds_them():
    """A request joins those in flight while their prompt + response positions stay within the budget (one alone
    always runs, however long), and each still gets what it gets alone."""
    model = tiny_model("llama", seed=5)
    requests = _requests(model)  # 105, 46, 91, 86 and 61 positions
    policy = make_policy("rift-stat", budget=16, obs_window=8)
    settings = dict(policy=policy, temperature=0.0, arm_ages=ARM_AGES)
    alone = [probe_request(model, prompt, response, **settings) for prompt, response in requests]
    sizes = [len(prompt) + len(response) for prompt, response in requests]
    in_flight: list[int] = []  # requests in flight at each stride (`on_tokens`' second argument)
    for budget, most in ((150, 2), (60, 1), (None, 5)):
        in_flight.clear()
        results = probe_requests(
            model,
            requests,
            batch_size=5,
            position_budget=budget,
            on_tokens=lambda _, requests_in_flight: in_flight.append(requests_in_flight),
            **settings,
        )
        for index, result in results:
            _assert_same(result, alone[index], exact=False, label=f"budget {budget} request {index}")
        assert max(in_flight) == most, (budget, sizes)
    with pytest.raises(ProbeError, match="position_budget"):
        next(probe_requests(model, requests, batch_size=2, position_budget=0, **settings))
