"""Target responses: generate them with the target model (teacher forcing needs fixed responses)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rift_ada.batch_cache import BatchedCache
from rift_ada.speculative import FULL_POLICY, forward_rows, greedy_tokens, row_cache


@torch.no_grad()
def generate_response(
    model: Any,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    eos_token_id: int | None = None,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """Sample (T > 0, seeded) or greedily decode (T = 0) a response with a plain full KV cache.

    ``min_new_tokens`` suppresses the end-of-sequence token until that many tokens exist, so
    staleness experiments get long outputs from small models; ``repetition_penalty`` (> 1, as in
    CTRL / transformers) divides the positive logits of tokens already generated, which keeps a
    small model from looping. Runs are teacher-forced on whatever response this produces.
    """
    request = ResponseRequest(prompt_ids, max_new_tokens, seed, min_new_tokens)
    return generate_responses(
        model,
        [request],
        temperature=temperature,
        eos_token_id=eos_token_id,
        repetition_penalty=repetition_penalty,
        on_token=on_token,
    )[0]


@dataclass
class ResponseRequest:
    """One prompt of a batched generation, with its own limits and seed."""

    prompt_ids: list[int]
    max_new_tokens: int
    seed: int = 0
    min_new_tokens: int = 0


def _next_token(
    logits: torch.Tensor,
    output: list[int],
    request: ResponseRequest,
    generator: torch.Generator,
    temperature: float,
    eos_token_id: int | None,
    repetition_penalty: float,
) -> int:
    """The token `generate_response` picks from ``logits`` (penalty, EOS suppression, sampling)."""
    logits = logits.float().clone()
    if repetition_penalty != 1.0 and output:
        seen = torch.tensor(sorted(set(output)), device=logits.device)
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / repetition_penalty, picked * repetition_penalty)
    if eos_token_id is not None and len(output) < request.min_new_tokens:
        logits[eos_token_id] = float("-inf")
    if temperature > 0:
        probs = torch.softmax(logits / temperature, -1).cpu()
        return int(torch.multinomial(probs, 1, generator=generator))
    return int(greedy_tokens(logits))


def _prefilled_batch(model: Any, requests: Sequence[ResponseRequest]) -> tuple[BatchedCache, list[torch.Tensor]]:
    """Each prompt prefilled alone (full KV, room for its response), joined into one batch; each row's last logits."""
    device = next(model.parameters()).device
    caches, logits = [], []
    for request in requests:
        cache = row_cache(model, FULL_POLICY)
        cache.expect_positions(len(request.prompt_ids) + request.max_new_tokens)  # never grown while decoding
        ids = torch.tensor([request.prompt_ids], device=device)
        logits.append(model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1])
        for layer in cache.budgeted_layers:  # decoding reads no query summaries
            layer.keeps_queries = False
        caches.append(cache)
    return BatchedCache.join(model, caches), logits


@torch.no_grad()
def generate_responses(
    model: Any,
    requests: Sequence[ResponseRequest],
    *,
    temperature: float = 0.0,
    eos_token_id: int | None = None,
    repetition_penalty: float = 1.0,
    on_token: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """`generate_response` for a batch of prompts in one batched decode (same tokens per request).

    Each prompt prefills alone, then all decode together, one token per active request per
    forward (per-request positions and lengths, `rift_ada.batch_cache`); a request that reaches
    its limit or EOS leaves the batch.
    """
    outputs: list[list[int]] = [[] for _ in requests]
    for index, request in enumerate(requests):
        if len(request.prompt_ids) < 1:
            raise ValueError(f"requests[{index}].prompt_ids: empty prompt")
    active = [index for index, request in enumerate(requests) if request.max_new_tokens > 0]
    if not active:
        return outputs
    # The rows' layers live in the batch alone, over its storage: a row that leaves it (`keep_rows`) must take no
    # reference to a storage along. Kept by the caller (a list of the prefilled caches), each finished row's view
    # held the whole batch's KV of its time: 28 rows of 2K-token prompts grew past 20 GiB as their EOS came.
    batch, logits = _prefilled_batch(model, [requests[index] for index in active])
    generators = [torch.Generator(device="cpu").manual_seed(request.seed) for request in requests]
    while active:
        feeds, starts, keep = [], [], []
        for row, index in enumerate(active):
            request, output = requests[index], outputs[index]
            token = _next_token(
                logits[row], output, request, generators[index], temperature, eos_token_id, repetition_penalty
            )
            output.append(token)
            if on_token is not None:
                on_token(token)
            if len(output) < request.max_new_tokens and token != eos_token_id:
                keep.append(row)
                feeds.append([token])
                starts.append(len(request.prompt_ids) + len(output) - 1)
        if len(keep) < len(active):
            active = [active[row] for row in keep]
            if not active:
                break
            batch.keep_rows(keep)
        logits = [out[-1] for out in forward_rows(model, batch, feeds, starts)]
    return outputs
