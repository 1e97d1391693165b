"""Speculative decoding inside Hugging Face transformers' own assisted-generation loop, with a
rift-ada budgeted draft KV and a RIFT-ada controller.

One call::

    from rift_ada.hf_assisted import rift_generate
    sequences, drafter = rift_generate(target, input_ids, draft_model=draft,
                                       policy=make_policy("rift-stat", 512), controller=ctl,
                                       max_new_tokens=256)            # T = 0: equals target.generate(greedy)

How it plugs in (transformers 5.x): ``target.generate(..., custom_generate=rift_assisted_decoding,
rift_drafter=RiftCandidateGenerator(...))``. ``generate`` prepares inputs, the target cache, logits
processors and stopping criteria, then calls the callable, which runs transformers' own
``GenerationMixin._assisted_decoding`` (target verification, Leviathan rejection sampling at T > 0,
cache cropping, stopping criteria) with our `RiftCandidateGenerator` as its candidate generator.
``_assisted_decoding`` builds its generator with ``self._get_candidate_generator(...)`` and offers no
argument to pass one in, so that one method is overridden on the target instance for the duration
of the call (and restored afterwards). See docs/serving.md.

Round structure: the candidate generator proposes exactly ``draft_length`` tokens per round (fewer
only where ``max_new_tokens`` ends), never the adaptive count of transformers' own assistant, so
rounds, acceptance lengths, draft-cache contents and the controller's decisions are those of
`rift_ada.speculative.speculative_generate` with `rift_ada.hooks.ControllerRefresh`.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from transformers.generation import GenerationMixin
from transformers.generation.candidate_generator import CandidateGenerator

from rift_ada.budget import CachePolicy
from rift_ada.cache import BudgetedCache, make_draft_cache
from rift_ada.controller import Controller
from rift_ada.hooks import ControllerRefresh
from rift_ada.speculative import RoundRecord, forward_tokens, greedy_tokens, token_entropy

__all__ = ["RiftCandidateGenerator", "rift_assisted_decoding", "rift_generate"]


class RiftCandidateGenerator(CandidateGenerator):
    """Drafts ``draft_length`` tokens per round with a budgeted draft cache; drives the controller.

    Per round (batch size 1), as in `rift_ada.speculative.speculative_generate`: snapshot the
    draft cache, draft K tokens, and after the target's verification roll the cache back and feed
    the committed tokens; then record the round (AL, entropies of the accepted drafts and the first
    rejected step) in the controller's hook and refresh the working set when it says so.
    """

    def __init__(
        self,
        draft_model: torch.nn.Module,
        policy: CachePolicy,
        controller: Controller | None = None,
        *,
        draft_length: int = 11,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        if draft_length < 1:
            raise ValueError(f"draft_length must be >= 1, got {draft_length}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.draft_model = draft_model
        self.draft_length = draft_length
        self.temperature = temperature
        self.cache: BudgetedCache = make_draft_cache(draft_model, policy)
        self.hook = ControllerRefresh(controller) if controller is not None else None
        device = next(draft_model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.max_length: int | None = None
        self.prompt_length: int | None = None
        self.cache_length = 0
        self.rounds: list[RoundRecord] = []
        self.refreshes = 0
        self._state: Any = None
        self._pending: list[int] = []
        self._drafted: list[int] = []
        self._entropies: list[float] = []

    @property
    def num_drafting_tokens(self) -> int:
        """Tokens drafted per round; transformers >= 5.25 reads it to size the target cache's rollback."""
        return self.draft_length

    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs: Any
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """(prompt + committed + K drafted tokens, draft logits / T at T > 0 else None)."""
        if input_ids.shape[0] != 1:
            raise ValueError("RiftCandidateGenerator: batch size 1 only (as transformers' assisted decoding)")
        ids = input_ids[0].tolist()
        if self.prompt_length is None:  # prefill: the draft sees the prompt but its last token
            self.prompt_length = len(ids)
            forward_tokens(self.draft_model, ids[:-1], self.cache, 0)
            self.cache.query_summary()  # query summaries cover the output only
            self.cache_length = len(ids) - 1
        remaining = self.max_length - len(ids) if self.max_length is not None else self.draft_length
        steps = max(1, min(self.draft_length, remaining))
        self._pending = ids[self.cache_length :]
        self._state = self.cache.snapshot()
        drafted: list[int] = []
        entropies: list[float] = []
        logits_out: list[torch.Tensor] = []
        feed, position = list(self._pending), self.cache_length
        for _ in range(steps):
            logits = forward_tokens(self.draft_model, feed, self.cache, position)[-1]
            position += len(feed)
            entropies.append(float(token_entropy(logits, self.temperature)))
            if self.temperature > 0:
                scaled = logits.float() / self.temperature
                logits_out.append(scaled)
                token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=self.generator))
            else:
                token = int(greedy_tokens(logits))
            drafted.append(token)
            feed = [token]
        self._drafted, self._entropies = drafted, entropies
        candidates = torch.tensor([ids + drafted], dtype=input_ids.dtype, device=input_ids.device)
        candidate_logits = torch.stack(logits_out)[None] if logits_out else None
        return candidates, candidate_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """After verification: roll the draft cache back, feed the kept tokens, record the round."""
        accepted = int(num_matches)
        kept = self._pending + self._drafted[:accepted]
        self.cache.restore(self._state)
        forward_tokens(self.draft_model, kept, self.cache, self.cache_length)
        self.cache_length += len(kept)
        n_committed = input_ids.shape[1] - self.prompt_length
        record = RoundRecord(len(self.rounds), n_committed - accepted - 1, accepted, self._entropies)
        if self.hook is not None and self.hook(record, n_committed, self.cache):
            self.cache.refresh()
            record.refreshed = True
            self.refreshes += 1
        self.rounds.append(record)


def rift_assisted_decoding(
    model: GenerationMixin,
    input_ids: torch.LongTensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    rift_drafter: RiftCandidateGenerator | None = None,
    **model_kwargs: Any,
) -> Any:
    """A ``custom_generate`` callable: transformers' assisted-decoding loop with ``rift_drafter``."""
    if rift_drafter is None:
        raise ValueError("rift_assisted_decoding: pass rift_drafter=RiftCandidateGenerator(...) to generate()")
    if generation_config.do_sample != (rift_drafter.temperature > 0):
        raise ValueError(
            f"rift_drafter.temperature={rift_drafter.temperature} but do_sample={generation_config.do_sample}: "
            "use T = 0 with greedy decoding and T > 0 with do_sample=True and the same temperature"
        )
    rift_drafter.max_length = generation_config.max_length

    def candidate_generator(self: Any, **kwargs: Any) -> CandidateGenerator:
        return rift_drafter

    model._get_candidate_generator = types.MethodType(candidate_generator, model)
    try:
        return GenerationMixin._assisted_decoding(
            model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
        )
    finally:
        del model._get_candidate_generator


def rift_generate(
    target_model: Any,
    input_ids: torch.LongTensor,
    *,
    draft_model: torch.nn.Module,
    policy: CachePolicy,
    controller: Controller | None = None,
    draft_length: int = 11,
    temperature: float = 0.0,
    seed: int = 0,
    **generate_kwargs: Any,
) -> tuple[torch.LongTensor, RiftCandidateGenerator]:
    """Run ``target_model.generate`` with a rift-ada budgeted draft; returns (sequences, the drafter).

    ``temperature`` = 0 decodes greedily (the output equals plain greedy decoding of the target);
    > 0 samples with that temperature (rejection sampling keeps the target's distribution).
    ``generate_kwargs`` go to ``generate`` (``max_new_tokens``, ``eos_token_id``, ...). The drafter
    holds the rounds (``.rounds``), the refresh count and the controller session (``.hook.session``).
    """
    drafter = RiftCandidateGenerator(
        draft_model, policy, controller, draft_length=draft_length, temperature=temperature, seed=seed
    )
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
    sequences = target_model.generate(
        input_ids,
        custom_generate=rift_assisted_decoding,
        rift_drafter=drafter,
        **sampling,
        **generate_kwargs,
    )
    return sequences, drafter
