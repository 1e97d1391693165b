"""Batches of requests: each request of a batch does exactly what it does alone; refreshes stay in their row."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import VOCAB, tiny_model

from rift_ada.budget import make_policy
from rift_ada.controller import Controller, make_controller_dict
from rift_ada.hooks import ControllerRefresh
from rift_ada.packed_linear import bfloat16_rows_exact, pack_linear_weights
from rift_ada.speculative import BatchRequest, PeriodicRefresh, speculative_generate, speculative_generate_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _mixed_requests(forced: list[int]) -> list[BatchRequest]:
    """Mixed prompt lengths, policies, output lengths and refresh schedules; one teacher-forced request."""
    stat = make_policy("rift-stat", budget=16, obs_window=8)
    prompt = _prompt(40, 44)
    return [
        BatchRequest(prompt, stat, max_new_tokens=30, refresh_hook=PeriodicRefresh(6)),
        BatchRequest(prompt, stat, max_new_tokens=30, refresh_hook=PeriodicRefresh(13)),  # same request, other policy
        BatchRequest(_prompt(41, 23), make_policy("snapkv", budget=12, obs_window=8), max_new_tokens=17),
        BatchRequest(_prompt(42, 61), make_policy("h2o", budget=16, obs_window=8), max_new_tokens=24),
        BatchRequest(_prompt(43, 9), make_policy("swa", budget=16), max_new_tokens=11),
        BatchRequest(_prompt(44, 35), stat, forced_tokens=forced, refresh_hook=PeriodicRefresh(9)),
    ]


def _alone(model, request: BatchRequest, **kwargs):
    hook = request.refresh_hook
    fresh = PeriodicRefresh(hook.interval) if isinstance(hook, PeriodicRefresh) else hook
    return speculative_generate(
        model,
        request.prompt_ids,
        policy=request.policy,
        max_new_tokens=request.max_new_tokens,
        seed=request.seed,
        refresh_hook=fresh,
        forced_tokens=request.forced_tokens,
        **kwargs,
    )


def _assert_same_as_alone(model, request: BatchRequest, got, label: str) -> None:
    """Tokens, accepted counts, refresh positions and draft entropies equal the request run alone."""
    alone = _alone(model, request, draft_length=4)
    assert got.tokens == alone.tokens, label
    assert [r.accepted for r in got.rounds] == [r.accepted for r in alone.rounds], label
    assert [r.position for r in got.rounds if r.refreshed] == [r.position for r in alone.rounds if r.refreshed]
    entropies = [value for r in got.rounds for value in r.draft_entropies]
    assert entropies == pytest.approx([value for r in alone.rounds for value in r.draft_entropies], abs=1e-4)


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "nemotron_h", "gpt_oss", "gemma3_text"])
def test_each_request_of_a_batch_equals_the_request_alone(architecture):
    model = tiny_model(architecture, seed=7)
    forced = _prompt(45, 20)
    requests = _mixed_requests(forced)
    batched = speculative_generate_batch(model, requests, draft_length=4)
    for index, (request, got) in enumerate(zip(requests, batched, strict=True)):
        _assert_same_as_alone(model, request, got, f"{architecture} request {index}")
        assert len(got.tokens) == (len(forced) if request.forced_tokens else request.max_new_tokens)
    assert batched[5].tokens == forced
    refreshed = [[r.position for r in result.rounds if r.refreshed] for result in batched[:2]]
    assert refreshed[0] and refreshed[1] and refreshed[0] != refreshed[1]  # refreshes at different rounds
    assert sum(r.accepted for r in batched[0].rounds) < 30  # compression really costs acceptances


@pytest.mark.parametrize("architecture", ["gpt_oss", "gemma3_text"])
def test_requests_that_start_inside_the_sliding_window_equal_the_requests_alone(architecture):
    """Prompts shorter than the models' own sliding window (8): while every position is in the window,
    a batch serves those layers as full rows (`BudgetedLayer.attends_everything`), then crosses over."""
    model = tiny_model(architecture, seed=7)
    stat = make_policy("rift-stat", budget=16, obs_window=4)
    requests = [
        BatchRequest(_prompt(60 + index, length), stat, max_new_tokens=14, refresh_hook=PeriodicRefresh(8))
        for index, length in enumerate((2, 3, 5, 7))
    ]
    batched = speculative_generate_batch(model, requests, draft_length=4)
    for index, (request, got) in enumerate(zip(requests, batched, strict=True)):
        _assert_same_as_alone(model, request, got, f"{architecture} request {index}")
        assert len(got.tokens) == request.max_new_tokens


def test_refreshing_one_request_leaves_the_others_selections_unchanged():
    from rift_ada.batch_cache import BatchedCache
    from rift_ada.cache import make_draft_cache
    from rift_ada.speculative import forward_rows

    model = tiny_model("llama", seed=8)
    policy = make_policy("rift-stat", budget=16, obs_window=8)
    prompts = [_prompt(50 + index, length) for index, length in enumerate((40, 52, 33))]
    caches = []
    with torch.no_grad():
        for prompt in prompts:
            cache = make_draft_cache(model, policy)
            model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            caches.append(cache)
        batch = BatchedCache.join(model, caches)
        starts = [len(prompt) for prompt in prompts]
        for step in range(12):  # new queries move the attention away from the prefill's
            tokens = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(step))
            feeds = [[int(token)] for token in tokens]
            forward_rows(model, batch, feeds, [start + step for start in starts])
        before = [[selection.clone() for selection in batch.row(row).selections()] for row in range(3)]
        batch.refresh_row(1)
        after = [batch.row(row).selections() for row in range(3)]
    for row in (0, 2):
        for old, new in zip(before[row], after[row], strict=True):
            assert torch.equal(old, new)
    assert any(not torch.equal(old, new) for old, new in zip(before[1], after[1], strict=True))


def test_batched_free_running_t1_keeps_the_target_distribution():
    """Chi-square of the first committed token of two prompts (different positions, one batch)."""
    draft = tiny_model("llama", seed=21)
    target = tiny_model("llama", seed=22)
    with torch.no_grad():
        for model in (draft, target):
            model.get_output_embeddings().weight.mul_(2.0)
    prompts = [[3, 17, 42, 8, 9, 60, 1, 5], [11, 4, 70, 2, 33, 9, 12, 50, 6, 21, 8, 19, 40]]
    with torch.no_grad():
        probs = [torch.softmax(target(torch.tensor([p])).logits[0, -1].double(), -1) for p in prompts]
        draft_probs = [torch.softmax(draft(torch.tensor([p])).logits[0, -1].double(), -1) for p in prompts]
    n_runs, batch = 400, 200
    counts = [torch.zeros(VOCAB), torch.zeros(VOCAB)]
    for first in range(0, 2 * n_runs, batch):
        requests = [
            BatchRequest(prompts[seed % 2], make_policy("swa", budget=4), max_new_tokens=3 + seed % 3, seed=seed)
            for seed in range(first, first + batch)
        ]
        results = speculative_generate_batch(draft, requests, target_model=target, draft_length=3, temperature=1.0)
        for request, result in zip(requests, results, strict=True):
            counts[request.seed % 2][result.tokens[0]] += 1
    for which in (0, 1):
        keep = probs[which] > 0.02
        observed = torch.cat([counts[which][keep], counts[which][~keep].sum()[None]]).numpy()
        expected = torch.cat([probs[which][keep], probs[which][~keep].sum()[None]]).numpy() * n_runs
        assert observed.sum() == n_runs
        assert chisquare(observed, expected).pvalue > 1e-3
        wrong = torch.cat([draft_probs[which][keep], draft_probs[which][~keep].sum()[None]]).numpy()
        assert chisquare(observed, wrong * n_runs / wrong.sum()).pvalue < 1e-3


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "nemotron_h"])
def test_continuous_batching_equals_each_request_alone(architecture):
    """With fewer slots than requests, waiting requests join the running batch as others finish."""
    model = tiny_model(architecture, seed=7)
    rounds: list[int] = []  # the request of every round, in the order the batch ran them
    requests = [
        dataclasses.replace(request, on_round=lambda _, index=index: rounds.append(index))
        for index, request in enumerate(_mixed_requests(_prompt(45, 20)))
    ]
    finished: list[int] = []
    batched = speculative_generate_batch(
        model, requests, draft_length=4, max_batch=2, on_finish=lambda index, _: finished.append(index)
    )
    assert sorted(finished) == list(range(len(requests)))
    spans = [(rounds.index(i), len(rounds) - 1 - rounds[::-1].index(i)) for i in range(len(requests))]
    running = [sum(first <= at <= last for first, last in spans) for at in range(len(rounds))]
    assert max(running) == 2  # never more than max_batch at once, and batched
    joined_late = [
        j for j in range(2, len(requests)) if any(spans[i][0] < spans[j][0] <= spans[i][1] for i in range(j))
    ]
    assert joined_late  # a waiting request joined while an earlier one was still running
    for index, (request, got) in enumerate(zip(requests, batched, strict=True)):
        _assert_same_as_alone(model, request, got, f"{architecture} request {index}")


def test_max_batch_must_be_positive():
    model = tiny_model("llama", seed=7)
    with pytest.raises(ValueError, match="max_batch"):
        speculative_generate_batch(model, _mixed_requests(_prompt(45, 20))[:1], max_batch=0)


def _drift_hook() -> ControllerRefresh:
    """A controller reading query summaries (query drift) and acceptance, every stride recorded."""
    policy = {"kind": "gate", "any": [{"signal": "query_drift", "op": ">=", "value": 0.02},
                                      {"signal": "acceptance", "op": "<=", "value": 1.5}]}  # fmt: skip
    controller = make_controller_dict(
        policy, name="drift", draft="tiny", target="tiny", temperature=0.0,
        schedule={"decision_stride": 4, "min_age": 4, "max_age": 64},
    )  # fmt: skip
    return ControllerRefresh(Controller.from_dict(controller), record_strides=True)


def _ragged_requests() -> list[BatchRequest]:
    """32 ragged requests: mixed policies, controllers reading query drift, every third teacher-forced."""
    policies = [make_policy("rift-stat", budget=16, obs_window=8), make_policy("h2o", budget=16, obs_window=8),
                make_policy("snapkv", budget=12, obs_window=8), make_policy("full")]  # fmt: skip
    made = []
    for index in range(32):
        forced = _prompt(300 + index, 14) if index % 3 == 0 else None
        made.append(BatchRequest(_prompt(200 + index, 12 + 3 * index), policies[index % 4],
                                 max_new_tokens=10 + index % 7, seed=index, refresh_hook=_drift_hook(),
                                 forced_tokens=forced))  # fmt: skip
    return made


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batches_of_16_and_32_equal_each_request_alone(temperature):
    """32 ragged requests (mixed policies, controllers reading query drift, teacher-forced and free)
    in batches of 16 (continuous) and 32: tokens, rounds and refreshes are the request's alone, and so
    is every stride's signals (up to the order of float additions in a batched forward)."""
    _assert_batches_equal_each_request_alone(tiny_model("llama", seed=9), temperature, signals_within=1e-5)


@pytest.mark.parametrize(
    ("architecture", "temperature"), [("llama", 0.0), ("llama", 1.0), ("gemma3_text", 1.0), ("gpt_oss", 0.0)]
)
def test_bfloat16_batches_equal_each_request_alone(architecture, temperature):
    """In bfloat16 each row of a batch attends over its own keys as it does alone (`rows_attend_alone`) and a
    verification feeds each row its own drafts only, so the 32 ragged requests at batches 16 and 32 give the
    tokens, rounds and refreshes of the requests alone (the padded batch gave 1-2 of 32 other tokens on the
    llama and Gemma3; benchmarks/investigations/bf16_batch_identity.py). On the llama every stride's signals
    are equal too where the packed bf16 products are row-exact (`bfloat16_rows_exact`; the model is packed as
    `load_model` packs it; unpacked, on an AMD EPYC without AMX, the llama's query drift, entropy and retained
    mass differed in the fourth to seventh digit while its tokens, rounds and refreshes did not); on Gemma3 and
    gpt-oss (attention sinks, experts) they differed in the fifth digit on AMX, unpacked (a kernel not yet
    pinned down). Within 1e-3 in all these. gpt_oss: the probabilities path."""
    model = tiny_model(architecture, seed=9).to(torch.bfloat16)
    pack_linear_weights(model)
    within = 0.0 if architecture == "llama" and bfloat16_rows_exact() else 1e-3
    _assert_batches_equal_each_request_alone(model, temperature, signals_within=within)


def _assert_batches_equal_each_request_alone(model, temperature: float, signals_within: float) -> None:
    alone_requests = _ragged_requests()
    alone = [
        speculative_generate_batch(model, [request], draft_length=4, temperature=temperature)[0]
        for request in alone_requests
    ]
    for max_batch in (16, 32):
        batch_requests = _ragged_requests()
        batched = speculative_generate_batch(
            model, batch_requests, draft_length=4, temperature=temperature, max_batch=max_batch
        )
        for index, (got, want) in enumerate(zip(batched, alone, strict=True)):
            label = f"batch {max_batch} request {index}"
            assert got.tokens == want.tokens, label
            assert [r.accepted for r in got.rounds] == [r.accepted for r in want.rounds], label
            assert [r.refreshed for r in got.rounds] == [r.refreshed for r in want.rounds], label
            got_strides = batch_requests[index].refresh_hook.strides
            want_strides = alone_requests[index].refresh_hook.strides
            assert [sorted(row) for row in got_strides] == [sorted(row) for row in want_strides], label
            for got_row, want_row in zip(got_strides, want_strides, strict=True):  # signals up to float order
                if signals_within == 0:
                    assert got_row == want_row, label
                else:
                    want_approx = {key: pytest.approx(value, abs=signals_within) for key, value in want_row.items()}
                    assert got_row == want_approx, label
    assert sum(result.refreshes for result in alone) > 0


class _CacheWitness:
    """A refresh hook that notes what the row's draft cache holds after every round, then defers to ``hook``."""

    def __init__(self, hook: ControllerRefresh):
        self.hook, self.seen = hook, []

    def __call__(self, record, n_committed, cache):
        self.seen.append([(layer.length, layer.query_count,
                           None if layer.query_positions is None else layer.query_positions.tolist(),
                           None if layer.query_buffer is None else layer.query_buffer.clone(),
                           layer.stored_keys().clone()) for layer in cache.budgeted_layers])  # fmt: skip
        return self.hook(record, n_committed, cache)


def _assert_same_witnessed(got: _CacheWitness, want: _CacheWitness, label: str) -> None:
    """Two runs' per-stride signals (within 1e-5) and, after every round, each budgeted layer's stored length,
    query count and positions, query buffer and keys (within 1e-5)."""
    for got_row, want_row in zip(got.hook.strides, want.hook.strides, strict=True):
        assert got_row == {key: pytest.approx(value, abs=1e-5) for key, value in want_row.items()}, label
    for got_round, want_round in zip(got.seen, want.seen, strict=True):
        for (length, count, positions, queries, keys), want_layer in zip(got_round, want_round, strict=True):
            assert (length, count, positions) == want_layer[:3], label
            torch.testing.assert_close(queries, want_layer[3], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(keys, want_layer[4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_cropped_rollback_leaves_the_draft_cache_as_a_re_feed_does(temperature, monkeypatch):
    """Rows that drop rejected draft steps by a crop (rift-stat, snapkv, full) keep the KV and queries
    of their committed steps: after every round each row stores what restoring the round start and
    feeding its committed tokens again stores (the rollback every row used before, and H2O rows and
    recurrent drafts still use), up to float order; tokens, rounds, refreshes and signals are the same."""
    from rift_ada.batch_cache import BatchedCache
    from rift_ada.cache import BudgetedLayer

    model = tiny_model("llama", seed=9)
    crops = []
    real_roll_back = BudgetedLayer.roll_back_to

    def counted_roll_back(self, length):
        crops.append(length)
        real_roll_back(self, length)

    monkeypatch.setattr(BudgetedLayer, "roll_back_to", counted_roll_back)

    def run():
        requests = [dataclasses.replace(r, refresh_hook=_CacheWitness(r.refresh_hook)) for r in _ragged_requests()]
        return requests, speculative_generate_batch(model, requests, draft_length=4, temperature=temperature)

    cropped_requests, cropped = run()
    assert crops
    monkeypatch.setattr(BatchedCache, "rolls_back_by_crop", lambda self, index: False)
    crops.clear()
    re_fed_requests, re_fed = run()
    assert not crops
    full_accepts = 0
    for index, (got, want) in enumerate(zip(cropped, re_fed, strict=True)):
        label = f"request {index}"
        assert got.tokens == want.tokens, label
        assert [r.accepted for r in got.rounds] == [r.accepted for r in want.rounds], label
        assert [r.refreshed for r in got.rounds] == [r.refreshed for r in want.rounds], label
        full_accepts += sum(r.accepted == 4 for r in got.rounds)
        _assert_same_witnessed(cropped_requests[index].refresh_hook, re_fed_requests[index].refresh_hook, label)
    assert full_accepts > 0  # rounds whose last draft no step fed (the one token a cropped rollback feeds)


def _own_output_requests(model, temperature: float) -> list[BatchRequest]:
    """12 teacher-forced requests on responses the model drafts well (its own greedy output; every third with
    every fifth token changed): mixed policies and prompt lengths, controllers reading query drift."""
    policies = [make_policy("rift-stat", budget=16, obs_window=8), make_policy("h2o", budget=16, obs_window=8),
                make_policy("snapkv", budget=12, obs_window=8), make_policy("full"),
                make_policy("rift-dyn", budget=16, obs_window=8, refresh_interval=6)]  # fmt: skip
    made = []
    for index in range(12):
        prompt = _prompt(400 + index, 10 + 4 * index)
        response = speculative_generate(model, prompt, policy=make_policy("full"), max_new_tokens=14 + index % 5,
                                        draft_length=4).tokens  # fmt: skip
        if index % 3 == 1:
            response = [(token + 1) % VOCAB if position % 5 == 4 else token for position, token in enumerate(response)]
        hook = _CacheWitness(_drift_hook())
        made.append(BatchRequest(prompt, policies[index % 5], seed=index, refresh_hook=hook, forced_tokens=response))
    return made


class _RowSteps:
    """Rows fed by the model's single-token forwards (draft steps), counted by a forward pre-hook."""

    def __init__(self, model):
        self.rows = 0
        self.handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] == 1:
            self.rows += ids.shape[0]


@pytest.mark.parametrize(
    ("architecture", "temperature"),
    [("llama", 0.0), ("llama", 1.0), ("gemma3_text", 0.0), ("gpt_oss", 1.0), ("qwen3_5", 0.0)],
)
def test_teacher_forced_rows_stop_drafting_at_their_first_rejection(architecture, temperature, monkeypatch):
    """A teacher-forced row knows its acceptance as it drafts, so it stops at its first rejected draft and the
    next steps feed only the rows still drafting (`BatchedCache.feed_rows`). Against the same batch with every
    row fed every step (the stopped rows riding along, as before): the same tokens, rounds, refreshes, draft
    entropies and signals, and after every round the same stored KV and queries in each row; each request gives
    what it gives alone; a forced row's entropies are its committed ones; and the steps feed fewer rows. A model
    with recurrent layers (Qwen3.5) feeds every row every step."""
    from rift_ada.batch_cache import BatchedCache

    model = tiny_model(architecture, seed=9)
    draft_length = 4

    def run():
        requests = _own_output_requests(model, temperature)
        counter = _RowSteps(model)
        results = speculative_generate_batch(model, requests, draft_length=draft_length, temperature=temperature)
        counter.handle.remove()
        return requests, results, counter.rows

    requests, stopping, fed_rows = run()
    monkeypatch.setattr(BatchedCache, "feeds_some_rows", property(lambda self: False))
    ride_requests, riding, ride_rows = run()
    monkeypatch.undo()
    full_rounds = rejected_rounds = 0
    for index, (got, want) in enumerate(zip(stopping, riding, strict=True)):
        label = f"{architecture} T={temperature} request {index}"
        assert got.tokens == want.tokens == requests[index].forced_tokens, label
        assert [(r.accepted, r.refreshed) for r in got.rounds] == [(r.accepted, r.refreshed) for r in want.rounds]
        for record in got.rounds:
            steps = min(draft_length, len(got.tokens) - record.position)
            assert len(record.draft_entropies) == min(record.accepted + 1, steps), label
            full_rounds += record.accepted == steps
            rejected_rounds += record.accepted < steps
        got_entropies = [value for r in got.rounds for value in r.draft_entropies]
        assert got_entropies == pytest.approx([value for r in want.rounds for value in r.draft_entropies], abs=1e-5)
        _assert_same_witnessed(requests[index].refresh_hook, ride_requests[index].refresh_hook, label)
        alone_request = _own_output_requests(model, temperature)[index]
        alone = speculative_generate_batch(model, [alone_request], draft_length=draft_length, temperature=temperature)
        assert got.tokens == alone[0].tokens, label
        assert [(r.accepted, r.refreshed) for r in got.rounds] == [(r.accepted, r.refreshed) for r in alone[0].rounds]
    assert full_rounds > 0 and rejected_rounds > 0  # rows that drafted every step beside rows that stopped
    assert sum(result.refreshes for result in stopping) > 0
    if architecture == "qwen3_5":
        assert fed_rows == ride_rows
    else:
        assert fed_rows < ride_rows


@pytest.mark.parametrize("stage", ["targets", "closed loop"])
def test_a_row_that_leaves_the_batch_takes_no_view_of_its_storage(stage, monkeypatch):
    """`keep_rows` replaces a batch's storage; a finished row's layer still views the old one, so nothing may keep
    that layer (a list of the prefilled caches did: 28 target rows of 2K-token prompts grew past 20 GiB as their
    EOS came). Every storage a `keep_rows` replaced is freed by the next one, here with the last-joined request
    finishing first."""
    import gc
    import weakref

    from rift_ada.batch_cache import BatchedCache, BatchedLayer
    from rift_ada.collectors.targets.generate import ResponseRequest, generate_responses

    model = tiny_model("llama", seed=9)
    replaced: dict[int, list[weakref.ref]] = {}
    freed: list[list[bool]] = []  # per keep_rows after a first one: is each storage the last one replaced gone?
    real_keep_rows = BatchedCache.keep_rows

    def keep_rows(self, rows):
        gc.collect()
        if id(self) in replaced:
            freed.append([ref() is None for ref in replaced[id(self)]])
        replaced[id(self)] = [weakref.ref(layer.keys) for layer in self.layers if isinstance(layer, BatchedLayer)]
        real_keep_rows(self, rows)

    monkeypatch.setattr(BatchedCache, "keep_rows", keep_rows)
    lengths = [30, 26, 22, 18, 14, 6]  # the last request finishes first
    if stage == "targets":
        asks = [ResponseRequest(_prompt(500 + i, 20 + 3 * i), n, i, 0) for i, n in enumerate(lengths)]
        generate_responses(model, asks, temperature=1.0)
    else:  # free-running: the batch verifies, so a target cache too
        stat = make_policy("rift-stat", budget=16, obs_window=8)
        asks = [BatchRequest(_prompt(500 + i, 20 + 3 * i), stat, max_new_tokens=n) for i, n in enumerate(lengths)]
        speculative_generate_batch(model, asks, draft_length=4)
    assert len(freed) >= 3 and all(all(layers) for layers in freed), freed


@pytest.mark.parametrize(
    ("architecture", "temperature"),
    [("llama", 0.0), ("llama", 1.0), ("gpt_oss", 0.0), ("qwen3_5", 1.0), ("gemma3_text", 0.0)],
)
def test_adjacent_runs_of_one_prompt_share_its_prefill(architecture, temperature, monkeypatch):
    """A collection's policies of one request are adjacent runs of one prompt: the prompt is prefilled once per
    cache policy and each later run of it takes a copy (`_SharedPrefills`), so a batch of 3 prompts x 5 runs over 2
    cache policies (refresh intervals aside) prefills 6 times, and every run, refreshing its own copy on its own
    schedule, gives the bits it gives with a prefill of its own and what it gives alone. With 2 slots the later
    runs join while the first still run."""
    import rift_ada.speculative as speculative

    model = tiny_model(architecture, seed=9)
    stat = make_policy("rift-stat", budget=16, obs_window=8)
    snapkv = make_policy("snapkv", budget=12, obs_window=8)
    prefilled: list[int] = []
    real_prefill = speculative._prefill_row_caches

    def counting(draft_model, target, request, positions, verifies):
        prefilled.append(len(request.prompt_ids))
        return real_prefill(draft_model, target, request, positions, verifies)

    monkeypatch.setattr(speculative, "_prefill_row_caches", counting)

    def runs() -> list[BatchRequest]:
        made = []
        for index in range(3):
            prompt, forced = _prompt(600 + index, 20 + 7 * index), _prompt(700 + index, 16)
            every_5 = dataclasses.replace(stat, refresh_interval=5)  # the same cache, its own Δ
            for policy, hook in ((stat, PeriodicRefresh(3)), (snapkv, None), (stat, PeriodicRefresh(7)),
                                 (stat, _drift_hook()), (every_5, None)):  # fmt: skip
                made.append(BatchRequest(prompt, policy, seed=index, refresh_hook=hook, forced_tokens=forced))
        return made

    batched = speculative_generate_batch(model, runs(), draft_length=4, temperature=temperature, max_batch=2)
    assert len(prefilled) == 6  # 3 prompts x 2 cache policies
    assert sum(result.refreshes for result in batched) > 0
    monkeypatch.setattr(speculative._SharedPrefills, "caches", lambda self, index, prefill: prefill())
    own = speculative_generate_batch(model, runs(), draft_length=4, temperature=temperature, max_batch=2)
    assert len(prefilled) == 6 + 15  # without sharing: one prefill a run
    for index, (request, got, want) in enumerate(zip(runs(), batched, own, strict=True)):
        label = f"{architecture} T={temperature} run {index}"
        assert got.tokens == want.tokens, label  # the same batch with a prefill of its own: the same bits
        assert [(r.accepted, r.refreshed) for r in got.rounds] == [(r.accepted, r.refreshed) for r in want.rounds]
        assert [v for r in got.rounds for v in r.draft_entropies] == [v for r in want.rounds for v in r.draft_entropies]
        alone = speculative_generate_batch(model, [request], draft_length=4, temperature=temperature)[0]
        assert got.tokens == alone.tokens, label
        assert [(r.accepted, r.refreshed) for r in got.rounds] == [(r.accepted, r.refreshed) for r in alone.rounds]
        entropies = [v for r in got.rounds for v in r.draft_entropies]
        assert entropies == pytest.approx([v for r in alone.rounds for v in r.draft_entropies], abs=1e-5), label
    refreshes = [[r.position for r in result.rounds if r.refreshed] for result in batched[:5]]
    assert len({tuple(positions) for positions in refreshes}) > 2  # the copies refreshed on their own schedules
