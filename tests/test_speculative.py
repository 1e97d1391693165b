"""The draft/verify loop: losslessness at T = 0, distribution at T > 0, AL bookkeeping."""

from __future__ import annotations

import functools

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import VOCAB, tiny_model
from transformers import DynamicCache

from rift_ada.budget import POLICY_NAMES, make_policy
from rift_ada.speculative import PeriodicRefresh, entropy_and_probs, greedy_tokens, speculative_generate, token_entropy


def _greedy(model, prompt, n_tokens):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
        out = []
        for _ in range(n_tokens):
            token = int(logits.argmax())
            out.append(token)
            logits = model(torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1]
    return out


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "gpt_oss", "nemotron_h", "gemma3_text"])
def test_t0_output_equals_target_greedy_for_every_policy(architecture):
    model = tiny_model(architecture, seed=11)
    prompt = torch.randint(0, VOCAB, (50,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = _greedy(model, prompt, 36)
    for name in POLICY_NAMES:
        policy = make_policy(name, budget=16, obs_window=8, **({"refresh_interval": 8} if name == "rift-dyn" else {}))
        result = speculative_generate(model, prompt, policy=policy, max_new_tokens=36, draft_length=5)
        assert result.tokens == expected, f"{architecture}/{name}"
        assert sum(r.al for r in result.rounds) == 36
        if name == "rift-dyn":
            assert result.refreshes >= 3


def test_full_kv_self_speculation_accepts_everything():
    model = tiny_model("llama", seed=2)
    prompt = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    result = speculative_generate(model, prompt, policy=make_policy("full"), max_new_tokens=12 * 5, draft_length=11)
    assert [r.al for r in result.rounds] == [12] * 5
    assert result.acceptance_length == 12


def test_external_target_and_refresh_hook_called():
    draft = tiny_model("llama", seed=5)
    target = tiny_model("llama", seed=6)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    hook = PeriodicRefresh(10)
    result = speculative_generate(
        draft,
        prompt,
        target_model=target,
        policy=make_policy("rift-stat", budget=16, obs_window=8),
        max_new_tokens=40,
        refresh_hook=hook,
    )
    assert result.tokens == _greedy(target, prompt, 40)
    assert result.refreshes == sum(r.refreshed for r in result.rounds) >= 3
    assert all(len(r.draft_entropies) >= 1 and min(r.draft_entropies) >= 0 for r in result.rounds)


def test_t1_next_token_distribution_matches_target():
    """Chi-square of the first two committed tokens against the target's exact distribution."""
    draft = tiny_model("llama", seed=21)
    target = tiny_model("llama", seed=22)
    with torch.no_grad():
        for model in (draft, target):
            model.get_output_embeddings().weight.mul_(2.0)  # a few likely tokens, clearly different
    prompt = [3, 17, 42, 8, 9, 60, 1, 5]
    with torch.no_grad():
        probs = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1)
        draft_probs = torch.softmax(draft(torch.tensor([prompt])).logits[0, -1].double(), -1)
    assert float((probs - draft_probs).abs().sum()) > 0.3  # the draft really differs
    keep = probs > 0.02
    n_runs = 800
    counts = torch.zeros(VOCAB)
    for seed in range(n_runs):
        result = speculative_generate(
            draft,
            prompt,
            target_model=target,
            policy=make_policy("swa", budget=4),
            max_new_tokens=1,
            draft_length=3,
            temperature=1.0,
            seed=seed,
        )
        counts[result.tokens[0]] += 1
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]]).numpy()
    expected = torch.cat([probs[keep], probs[~keep].sum()[None]]).numpy() * n_runs
    assert chisquare(observed, expected).pvalue > 1e-3
    # The same test rejects the draft's own distribution (a broken rule that accepts everything).
    wrong = torch.cat([draft_probs[keep], draft_probs[~keep].sum()[None]]).numpy() * n_runs
    assert chisquare(observed, wrong * observed.sum() / wrong.sum()).pvalue < 1e-3


_T1_DRAFT_LENGTH = 4


@functools.cache
def _t1_verified_drafts(teacher_forced: bool) -> list[tuple[int, bool, float, float]]:
    """(step in its round, accepted, alpha, c) of every draft the T = 1 loop verified, 192 runs.

    alpha = sum_x min(p, q) and c = min(1, q(x) / p(x)) at the committed token x, with p and q from
    plain full forwards over the committed text (the reference). ``teacher_forced``: each run is fed
    the text of a free-running run of another seed (a sample of the target distribution)."""
    import copy

    from rift_ada.speculative import BatchRequest, speculative_generate_batch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny forwards: extra threads only spin
    try:
        target = tiny_model("llama", seed=22)
        draft = copy.deepcopy(target)
        with torch.no_grad():  # a draft close to the target, so rounds often accept several drafts
            weight = draft.get_output_embeddings().weight
            weight.add_(0.6 * weight.std() * torch.randn(weight.shape, generator=torch.Generator().manual_seed(5)))
        prompts = [[3, 17, 42, 8, 9, 60, 1, 5], [11, 4, 70, 2, 33, 9, 12, 50, 6, 21]]

        def run(seed_offset: int, forced: list[list[int]] | None) -> list:
            requests = [
                BatchRequest(
                    prompts[seed % 2],
                    make_policy("full"),
                    max_new_tokens=16,
                    seed=seed + seed_offset,
                    forced_tokens=None if forced is None else forced[seed],
                )
                for seed in range(192)
            ]
            results = speculative_generate_batch(
                draft, requests, target_model=target, draft_length=_T1_DRAFT_LENGTH, temperature=1.0
            )
            return list(zip(requests, results, strict=True))

        runs = run(0, None)
        if teacher_forced:
            runs = run(1000, [result.tokens for _, result in runs])
        trials = []
        with torch.no_grad():
            for request, result in runs:
                text = torch.tensor([request.prompt_ids + result.tokens])
                p = torch.softmax(target(text).logits[0].double(), -1)
                q = torch.softmax(draft(text).logits[0].double(), -1)
                alpha = torch.minimum(p, q).sum(-1)  # alpha[i]: the draft of the token at text position i + 1
                token = text[0, 1:, None]
                c = torch.clamp(q[:-1].gather(-1, token)[:, 0] / p[:-1].gather(-1, token)[:, 0], max=1)
                for record in result.rounds[:-1]:  # the last round's count is cut to the output limit
                    for step in range(min(record.accepted + 1, _T1_DRAFT_LENGTH)):  # accepted + the rejected one
                        i = len(request.prompt_ids) - 1 + record.position + step
                        trials.append((step, step < record.accepted, float(alpha[i]), float(c[i])))
    finally:
        torch.set_num_threads(threads)
    return trials


def _count_test(trials: list[tuple[int, bool, float, float]], column: int) -> tuple[float, float, float]:
    """(accepted, expected, sd) of a Bernoulli count with the probabilities in ``column`` (2: alpha, 3: c)."""
    probabilities = [trial[column] for trial in trials]
    variance = sum(a * (1 - a) for a in probabilities)
    return sum(trial[1] for trial in trials), sum(probabilities), variance**0.5


def test_t1_free_running_accepts_each_draft_with_probability_sum_min_p_q():
    """Every draft the free-running loop verified is a Bernoulli trial with P = sum_x min(p, q) given the
    committed prefix: the accepted counts match their sums, for a round's first draft and the later ones."""
    trials = _t1_verified_drafts(teacher_forced=False)
    for name, subset in (("first", [t for t in trials if t[0] == 0]), ("later", [t for t in trials if t[0] > 0])):
        accepted, expected, sd = _count_test(subset, 2)
        assert sd > 20**0.5, name  # enough uncertain trials to test
        assert abs(accepted - expected) < 4 * sd, (name, accepted, expected)


@pytest.mark.parametrize("teacher_forced", [False, True], ids=["free-running", "teacher-forced"])
def test_t1_given_its_token_a_draft_is_accepted_with_probability_min_1_q_over_p(teacher_forced: bool):
    """Given the committed token x, a verified draft is accepted with min(1, q(x) / p(x)) (what the probe
    records as token_acceptance and replay samples), in the free-running loop and, fed a sample of the
    target distribution, in the teacher-forced one. Among drafts whose token the draft found unlikely
    (c < 0.5) the acceptances follow c and are far below sum min(p, q): the test tells the two apart."""
    trials = _t1_verified_drafts(teacher_forced)
    for name, subset in (("all", trials), ("c < 0.5", [t for t in trials if t[3] < 0.5])):
        accepted, expected, sd = _count_test(subset, 3)
        assert sd > 3, name
        assert abs(accepted - expected) < 4 * sd, (name, accepted, expected)
    unlikely = [t for t in trials if t[3] < 0.5]
    accepted, by_alpha, sd_alpha = _count_test(unlikely, 2)
    assert by_alpha - accepted > 4 * sd_alpha, (accepted, by_alpha)  # sum min(p, q) is no model of these


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_is_argmax_ties_included(dtype):
    generator = torch.Generator().manual_seed(3)
    for shape in [(VOCAB,), (5, VOCAB), (3, 4, 2000)]:
        logits = torch.randn(*shape, generator=generator).to(dtype)
        flat = logits.view(-1, shape[-1])
        top = flat.max(-1).values
        flat[::2, 1], flat[::2, -2] = top[::2] + 1, top[::2] + 1  # a tie for the first place: the first index wins
        assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
        assert bool((greedy_tokens(logits).view(-1)[::2] == 1).all())


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_entropy_and_probs_against_a_float64_computation(temperature):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(5)) * 3
    scaled = logits.double() / (temperature if temperature > 0 else 1.0)
    probs = torch.softmax(scaled, -1)
    entropy = -(probs * torch.log(probs)).sum(-1)
    got_entropy, got_probs = entropy_and_probs(logits, temperature)
    assert got_entropy.dtype == got_probs.dtype == torch.float32
    torch.testing.assert_close(got_entropy.double(), entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_probs.double(), probs, atol=1e-6, rtol=0)
    assert torch.equal(token_entropy(logits, temperature), got_entropy)
    low = logits.bfloat16()  # upcast exactly first
    assert torch.equal(token_entropy(low, temperature), entropy_and_probs(low.float(), temperature)[0])


class _ForwardCount:
    """Counts a model's forwards (a forward pre-hook on the module itself)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.calls += 1


@pytest.mark.parametrize("architecture", ["llama", "qwen3_5", "gemma3_text"])
def test_a_teacher_forced_t0_loop_never_runs_the_target_and_equals_the_verifying_loop(architecture):
    """At T = 0 a forced round's acceptance is the match against the response, so the loop runs no verification;
    the reference is the free-running loop, which verifies every round, on a response that is its own output."""
    draft, target = tiny_model(architecture, seed=21), tiny_model(architecture, seed=22)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    for name, extra in (("rift-stat", {}), ("rift-dyn", {"refresh_interval": 8})):
        policy = make_policy(name, budget=16, obs_window=8, **extra)
        run = functools.partial(speculative_generate, draft, prompt, target_model=target, policy=policy, draft_length=5)
        verified = run(max_new_tokens=30)
        count = _ForwardCount(target)
        forced = run(forced_tokens=verified.tokens)
        count.handle.remove()
        assert count.calls == 0, f"{architecture}/{name}: the target ran {count.calls} forwards"
        assert forced.tokens == verified.tokens

        # a forced row stops drafting at its first rejected draft: its entropies are the committed ones
        assert [(r.accepted, r.refreshed, r.draft_entropies) for r in forced.rounds] == [
            (r.accepted, r.refreshed, r.committed_entropies) for r in verified.rounds
        ]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_target_token_probs_are_a_plain_forward_s_probabilities_of_the_response(temperature):
    from rift_ada.speculative import FULL_POLICY, TARGET_PASS_CHUNK, forward_tokens, row_cache, target_token_probs

    model = tiny_model("qwen3_5", seed=23)  # linear-attention layers: the pass carries their state over chunks
    generator = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, VOCAB, (30,), generator=generator).tolist()
    response = torch.randint(0, VOCAB, (TARGET_PASS_CHUNK + 17,), generator=generator).tolist()  # two chunks
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].double()
        expected = torch.softmax(logits / temperature, -1)[torch.arange(len(response)), response]
        cache = row_cache(model, FULL_POLICY)
        forward_tokens(model, prompt[:-1], cache, 0, logits=False)
        got = target_token_probs(model, cache, prompt, response, temperature)
    assert got.dtype == torch.float32 and got.shape == (len(response),)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def test_a_teacher_forced_t1_batch_runs_the_target_once_over_each_response():
    """At T > 0 a forced row reads p_target of each response token from one pass when it starts (one forward per
    `TARGET_PASS_CHUNK` tokens after the prompt's prefill), shared by the runs of one call on the same text (a
    collection's policies), and each run gives what it gives alone. The acceptance law itself is tested above
    (`test_t1_given_its_token_a_draft_is_accepted_with_probability_min_1_q_over_p`, teacher-forced)."""
    from rift_ada.speculative import TARGET_PASS_CHUNK, BatchRequest, speculative_generate_batch

    draft, target = tiny_model("llama", seed=24), tiny_model("llama", seed=25)
    generator = torch.Generator().manual_seed(10)
    prompt = torch.randint(0, VOCAB, (30,), generator=generator).tolist()
    response = torch.randint(0, VOCAB, (TARGET_PASS_CHUNK + 6,), generator=generator).tolist()
    policies = [make_policy("rift-stat", budget=16, obs_window=8), make_policy("snapkv", budget=16, obs_window=8)]
    requests = [BatchRequest(prompt, policy, seed=3, forced_tokens=response) for policy in policies]
    run = functools.partial(speculative_generate_batch, draft, target_model=target, draft_length=5, temperature=1.0)
    count = _ForwardCount(target)
    together = run(requests)
    count.handle.remove()
    assert count.calls == 1 + 2  # the prompt's prefill, then the response in two chunks, once for both runs
    for request, result in zip(requests, together, strict=True):
        alone = run([request])[0]
        assert result.tokens == alone.tokens == response
        assert [r.accepted for r in result.rounds] == [r.accepted for r in alone.rounds]
