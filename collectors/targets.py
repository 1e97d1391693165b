"""Target responses: generate them with the target model (teacher forcing needs fixed responses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache


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
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt_ids], device=device), cache=cache, use_cache=True).logits[0, -1]
    output: list[int] = []
    for index in range(max_new_tokens):
        logits = logits.float()
        if repetition_penalty != 1.0 and output:
            seen = torch.tensor(sorted(set(output)), device=logits.device)
            picked = logits[seen]
            logits[seen] = torch.where(picked > 0, picked / repetition_penalty, picked * repetition_penalty)
        if eos_token_id is not None and index < min_new_tokens:
            logits[eos_token_id] = float("-inf")
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1).cpu()
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            token = int(logits.argmax())
        output.append(token)
        if on_token is not None:
            on_token(token)
        if eos_token_id is not None and token == eos_token_id:
            break
        position = torch.tensor([[len(prompt_ids) + index]], device=device)
        logits = model(
            input_ids=torch.tensor([[token]], device=device), position_ids=position, cache=cache, use_cache=True
        ).logits[0, -1]
    return output
