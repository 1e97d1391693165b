"""The draft/verify loop: a budgeted draft proposes K tokens, the target verifies (batch size 1).

T = 0 accepts the longest prefix of draft tokens equal to the target's greedy choices; T > 0 uses
rejection sampling (Leviathan et al., 2023), so the output follows the target distribution
whatever the draft's cache policy. A round's acceptance length (AL) is accepted drafts + 1.
Rejected draft tokens leave the draft cache: the cache is rolled back to the start of the round
and the committed tokens are fed again, which also works for recurrent (linear-attention, Mamba)
layers that cannot be cropped.

With ``forced_tokens`` (a fixed target response) the loop is teacher-forced: at T = 0 the draft's
greedy proposals are matched against the response; at T > 0 the draft is fed the response and a
position is accepted with probability sum_x min(p_target(x), q_draft(x)). Either way the committed
text is the response, so runs of different policies see the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rift_ada.budget import CachePolicy
from rift_ada.cache import BudgetedCache, make_draft_cache, restore_cache, snapshot_cache


@dataclass
class RoundRecord:
    """One draft/verify round."""

    index: int
    position: int  # output tokens committed before the round
    accepted: int  # drafted tokens accepted
    draft_entropies: list[float]  # draft entropy of every drafted step, in order
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


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    log_probs = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def _forward(model: Any, tokens: list[int], cache: Any, start: int) -> torch.Tensor:
    """Logits (n, vocab) of feeding ``tokens`` at positions start.. into ``cache``."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokens], device=device)
    positions = torch.arange(start, start + len(tokens), device=device)[None]
    output = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True)
    return output.logits[0]


def _croppable(cache: DynamicCache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


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
    if len(prompt_ids) < 2:
        raise ValueError("prompt_ids: need at least 2 prompt tokens")
    if draft_length < 1:
        raise ValueError(f"draft_length must be >= 1, got {draft_length}")
    target = target_model if target_model is not None else draft_model
    device = next(draft_model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)  # multinomial needs it on the logits' device
    draft_cache = make_draft_cache(draft_model, policy)
    target_cache = DynamicCache(config=target.config)
    if refresh_hook is None and policy.refresh_interval is not None:
        refresh_hook = PeriodicRefresh(policy.refresh_interval)
    limit = len(forced_tokens) if forced_tokens is not None else max_new_tokens

    _forward(draft_model, prompt_ids[:-1], draft_cache, 0)
    draft_cache.query_summary()  # query summaries cover the output only
    _forward(target, prompt_ids[:-1], target_cache, 0)
    pending = [prompt_ids[-1]]  # committed tokens not yet in either cache
    cache_length = len(prompt_ids) - 1
    output: list[int] = []
    result = SpeculativeResult(len(prompt_ids), output)
    since_refresh = 0

    while len(output) < limit:
        steps = min(draft_length, limit - len(output))
        draft_state = draft_cache.snapshot()
        drafted: list[int] = []
        draft_dists: list[torch.Tensor] = []
        entropies: list[float] = []
        feed, position = list(pending), cache_length
        for step in range(steps):
            logits = _forward(draft_model, feed, draft_cache, position)[-1]
            position += len(feed)
            entropies.append(float(_entropy(logits, temperature)))
            if forced_tokens is not None and temperature > 0:
                token = forced_tokens[len(output) + step]
                draft_dists.append(_probs(logits, temperature))
            elif temperature > 0:
                dist = _probs(logits, temperature)
                draft_dists.append(dist)
                token = int(torch.multinomial(dist, 1, generator=generator))
            else:
                token = int(logits.argmax())
            drafted.append(token)
            feed = [token]

        target_state = None if _croppable(target_cache) else snapshot_cache(target_cache)
        target_logits = _forward(target, pending + drafted, target_cache, cache_length)[len(pending) - 1 :]
        accepted, next_token = _verify(
            drafted, draft_dists, target_logits, temperature, generator, forced_tokens, len(output)
        )
        committed = drafted[:accepted] + [next_token]
        committed = committed[: limit - len(output)]

        # Rejected draft tokens leave both caches; committed ones are fed to the draft again.
        draft_cache.restore(draft_state)
        kept = pending + drafted[:accepted]
        if len(committed) <= accepted:  # the limit cut the round inside the accepted drafts
            kept = pending + drafted[: len(committed) - 1]
        if target_state is None:
            surplus = len(pending) + len(drafted) - len(kept)
            if surplus > 0:
                target_cache.crop(-surplus)
        else:
            restore_cache(target_cache, target_state)
            _forward(target, kept, target_cache, cache_length)
        _forward(draft_model, kept, draft_cache, cache_length)
        cache_length += len(kept)
        pending = [committed[-1]]

        record = RoundRecord(len(result.rounds), len(output), min(accepted, len(committed) - 1), entropies)
        output.extend(committed)
        since_refresh += len(committed)
        if refresh_hook is not None and refresh_hook(record, len(output), draft_cache):
            draft_cache.refresh()
            record.refreshed = True
            result.refreshes += 1
            since_refresh = 0
        record.age = since_refresh
        result.rounds.append(record)
        if on_round is not None:
            on_round(record)
        if eos_token_id is not None and forced_tokens is None and eos_token_id in committed:
            del output[len(output) - len(committed) + committed.index(eos_token_id) + 1 :]
            break
    return result


def _verify(
    drafted: list[int],
    draft_dists: list[torch.Tensor],
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
    forced_tokens: list[int] | None,
    offset: int,
) -> tuple[int, int]:
    """(accepted drafts, the token the target adds) for one round."""
    if temperature <= 0:
        greedy = target_logits.argmax(-1).tolist()
        reference = forced_tokens[offset : offset + len(drafted) + 1] if forced_tokens is not None else greedy
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == reference[accepted]:
            accepted += 1
        if forced_tokens is not None:
            return accepted, reference[accepted] if accepted < len(reference) else greedy[accepted]
        return accepted, greedy[accepted]
    for index, token in enumerate(drafted):
        target_dist = _probs(target_logits[index], temperature)
        draft_dist = draft_dists[index]
        uniform = float(torch.rand((), generator=generator))
        if forced_tokens is not None:
            if uniform < float(torch.minimum(target_dist, draft_dist).sum()):
                continue
            return index, forced_tokens[offset + index]
        if uniform < min(1.0, float(target_dist[token] / draft_dist[token])):
            continue
        residual = torch.clamp(target_dist - draft_dist, min=0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else target_dist
        return index, int(torch.multinomial(residual, 1, generator=generator))
    final = _probs(target_logits[len(drafted)], temperature)
    if forced_tokens is not None:
        return len(drafted), forced_tokens[offset + len(drafted)] if offset + len(drafted) < len(forced_tokens) else 0
    return len(drafted), int(torch.multinomial(final, 1, generator=generator))
