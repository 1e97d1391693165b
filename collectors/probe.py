"""Probe collection: one teacher-forced pass over a fixed target response, every arm per stride.

The draft runs over the response stride by stride. A *canonical* cache stores the full draft KV
(full attention): it gives the ``full`` arm, the prefill selection and the retained mass. At every
stride boundary each compressed arm rescores a selection from its *own* history (its stored KV and
its last ``obs_window`` queries, computed under its own working sets, as a closed-loop draft's
refresh does); ``age:N`` uses the selection it made N tokens before the stride, ``stat`` the
prefill selection, ``full`` everything. Each compressed arm keeps its own KV history (and
recurrent state), computed under its own working sets as a closed-loop draft's would be, and all
of them run as one batched forward per stride (batch = arms). Never a K-step draft loop: the cost
is one pass per arm per stride, plus one rescoring of the arms that will read it (arm N reads a
stride's selection N tokens later, if the response lasts that long). An arm at least as old as
the response's last stride start never refreshes, so it would repeat ``stat``: it is not run, and
its rows are stat's.

Recorded per output position and arm: the outcome a round would see there (T = 0: does the draft's
greedy token equal the target token; T > 0: sum_x min(p_target(x), q_draft(x)), and the acceptance
probability given the response's token x, min(1, q_draft(x) / p_target(x))) and the draft
entropy; per stride and arm: query drift against the arm's last refresh and retained mass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from rift_ada.budget import CachePolicy
from rift_ada.cache import BudgetedCache, BudgetedLayer, make_draft_cache
from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT, DEFAULT_ARM_AGES, age_arm
from rift_ada.speculative import acceptance_given_token


class ProbeError(ValueError):
    """Probe settings that cannot work (names the field)."""


@dataclass
class ProbeResult:
    """Arrays of one request: (A, P) per position, (A, S) per stride, arms in ``arms`` order."""

    arms: tuple[str, ...]
    outcome: np.ndarray
    entropy: np.ndarray
    query_drift: np.ndarray
    retained_mass: np.ndarray
    token_acceptance: np.ndarray | None = None  # (A, P), T > 0: min(1, q(x) / p(x)) at the response token x


def probe_arms(arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES) -> tuple[str, ...]:
    return tuple(age_arm(age) for age in arm_ages) + (ARM_STAT, ARM_FULL)


def _cosine_drift(now: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """1 - mean over layers and groups of cos(now, reference)."""
    values = [
        torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).mean()
        for a, b in zip(now, reference, strict=True)
    ]
    return float(1.0 - torch.stack(values).mean())


def _entropy_and_probs(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    probs = log_probs.exp()
    return -(probs * log_probs).sum(-1), probs


def _forward(model: Any, tokens: torch.Tensor, cache: Any, start: int) -> torch.Tensor:
    positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None].expand(tokens.shape[0], -1)
    return model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True).logits


def _arm_working_sets(
    layer: BudgetedLayer, selections: list[torch.Tensor], window_start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad per-arm selections to one tensor; unfilled (prefix) selections see positions < k."""
    capacity = layer.capacity
    device = layer.keys.device
    padded, valid, prefix_limit = [], [], []
    for selection in selections:
        if selection.shape[-1] < capacity:  # unfilled: everything below k that precedes the window
            count = min(capacity, window_start)
            selection = torch.arange(count, device=device).expand(selection.shape[1], count)[None]
            prefix_limit.append(capacity)
        else:
            prefix_limit.append(0)
        size = selection.shape[-1]
        pad = capacity - size
        padded.append(torch.nn.functional.pad(selection[0], (0, pad)))
        valid.append(torch.arange(capacity, device=device) < size)
    return (
        torch.stack(padded),
        torch.stack(valid)[:, None, :],
        torch.tensor(prefix_limit, device=device),
    )


@torch.no_grad()
def probe_request(
    draft_model: Any,
    prompt_ids: list[int],
    response_ids: list[int],
    *,
    policy: CachePolicy,
    temperature: float = 0.0,
    arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES,
    decision_stride: int = 8,
    target_model: Any | None = None,
) -> ProbeResult:
    """Probe one request; ``target_model=None`` is KV self-speculation (the full arm is the target)."""
    if any(age % decision_stride for age in arm_ages):
        raise ProbeError(f"arm ages {arm_ages} must be multiples of decision_stride={decision_stride}")
    if policy.is_full:
        raise ProbeError("policy: probe arms need a compressed policy (got 'full')")
    if len(prompt_ids) < 2 or not response_ids:
        raise ProbeError("need a prompt of >= 2 tokens and a non-empty response")
    device = next(draft_model.parameters()).device
    requested_arms = probe_arms(arm_ages)
    n_out = len(response_ids)
    n_strides = -(-n_out // decision_stride)
    # An arm at least as old as the last stride's start never refreshes within this response: it
    # reads the prefill selection throughout, as `stat` does, so it is not run and copies stat's rows.
    arm_ages = tuple(age for age in arm_ages if age // decision_stride < n_strides - 1)
    arms = probe_arms(arm_ages)
    compressed = len(arm_ages) + 1  # the age arms and stat run batched; full is the canonical pass
    outcome = np.full((len(arms), n_out), np.nan, dtype=np.float32)
    entropy = np.full((len(arms), n_out), np.nan, dtype=np.float32)
    query_drift = np.full((len(arms), n_strides), np.nan, dtype=np.float32)
    retained_mass = np.full((len(arms), n_strides), np.nan, dtype=np.float32)
    token_acceptance = np.full((len(arms), n_out), np.nan, dtype=np.float32) if temperature > 0 else None

    # The canonical cache stores the full draft KV with full attention: it scores the selections,
    # gives the `full` arm and measures retained mass. The arms cache holds one KV history (and one
    # recurrent state, for hybrid models) per compressed arm, each computed under its own working set.
    canonical: BudgetedCache = make_draft_cache(draft_model, policy)
    layers = canonical.budgeted_layers
    for layer in layers:
        layer.force_full = True
    sequence = torch.tensor([prompt_ids + response_ids], device=device)
    start = len(prompt_ids) - 1
    _forward(draft_model, sequence[:, :start], canonical, 0)
    target_cache = None
    if target_model is not None:
        target_cache = DynamicCache(config=target_model.config)
        _forward(target_model, sequence[:, :start], target_cache, 0)
    for layer in layers:
        layer.pop_query_summary()
    arms_cache = copy.deepcopy(canonical)
    expand = torch.zeros(compressed, dtype=torch.long, device=device)
    for index, layer in enumerate(arms_cache.layers):
        if isinstance(layer, BudgetedLayer):
            layer.force_full = False
            layer.expand_batch(compressed)
        else:
            arms_cache.layers[index].reorder_cache(expand)
    arm_layers = arms_cache.budgeted_layers
    for layer in arm_layers:  # rescoring reuses each stride's attention mass while it is in the window
        layer.rescore_block = decision_stride

    max_age_strides = max(arm_ages, default=0) // decision_stride
    history: dict[int, list[torch.Tensor] | None] = {}  # stride -> per layer (arms, kv, k) own selections
    arm_history: dict[int, list[torch.Tensor]] = {}  # stride -> per-layer (arms, kv, d) query summaries
    full_history: dict[int, list[torch.Tensor]] = {}  # stride -> per-layer (kv, d) canonical summaries
    stat_selection = [layer.compute_selection() for layer in layers]

    for stride in range(n_strides):
        first = stride * decision_stride
        n_new = min(decision_stride, n_out - first)
        position = start + first
        tokens = sequence[:, position : position + n_new]
        # Each age arm refreshes from its own history (its KV and its last obs_window queries, both
        # computed under its own working sets), as a closed-loop draft does: one batched rescoring.
        # Only the arms that will read this stride's selection rescore: arm i reads it at stride
        # + age_i / decision_stride, if the response lasts that long (`stat` never reads it).
        read_later = [i for i, age in enumerate(arm_ages) if stride + age // decision_stride < n_strides]
        rows = slice(0, max(read_later) + 1) if stride and read_later else None
        history[stride] = None if rows is None else [layer.compute_selection(rows) for layer in arm_layers]
        history.pop(stride - max_age_strides - 1, None)
        window_start = max(0, position - layers[0].window + 1)
        arm_refresh = [max(0, stride - age // decision_stride) for age in arm_ages]
        arm_selections = [
            stat_selection if s == 0 else [selection[arm][None] for selection in history[s]]
            for arm, s in enumerate(arm_refresh)
        ] + [stat_selection]
        for index, (layer, arm_layer) in enumerate(zip(layers, arm_layers, strict=True)):
            working_set = _arm_working_sets(layer, [selections[index] for selections in arm_selections], window_start)
            arm_layer.arm_selection, arm_layer.arm_valid, arm_layer.arm_prefix_limit = working_set
            layer.mass_targets = [working_set]

        arm_logits = _forward(draft_model, tokens.expand(compressed, -1), arms_cache, position)
        arm_history[stride] = [layer.arm_query_sum / n_new for layer in arm_layers]
        full_logits = _forward(draft_model, tokens, canonical, position)
        full_history[stride] = [layer.pop_query_summary()[0] for layer in layers]
        for table in (arm_history, full_history):
            table.pop(stride - max_age_strides - 2, None)
        if stride == 0:
            arm_first, full_first = arm_history[0], full_history[0]
        mass = torch.stack([layer.retained for layer in layers]).mean(0)
        for layer in layers:
            layer.mass_targets = None
        if target_model is not None:
            target_logits = _forward(target_model, tokens, target_cache, position)[0]
        else:
            target_logits = full_logits[0]

        all_logits = torch.cat([arm_logits, full_logits], 0)  # (A, n_new, vocab)
        arm_entropy, arm_probs = _entropy_and_probs(all_logits, temperature)
        expected = torch.tensor(response_ids[first : first + n_new], device=device)
        if temperature > 0:
            target_probs = torch.softmax(target_logits.float() / temperature, -1)
            values = torch.minimum(arm_probs, target_probs[None]).sum(-1)
            # Given the text's token x, rejection sampling accepts the draft with min(p, q)(x) / p(x).
            draft_at_token = arm_probs.gather(-1, expected[None, :, None].expand(len(arms), -1, 1))[..., 0]
            target_at_token = target_probs.gather(-1, expected[:, None])[:, 0]
            given_token = acceptance_given_token(draft_at_token, target_at_token[None])
            token_acceptance[:, first : first + n_new] = given_token.cpu().numpy()
        else:
            values = (all_logits.argmax(-1) == expected[None]).float()
        outcome[:, first : first + n_new] = values.cpu().numpy()
        entropy[:, first : first + n_new] = arm_entropy.cpu().numpy()
        retained_mass[:compressed, stride] = mass.cpu().numpy()
        retained_mass[-1, stride] = 1.0
        # Query drift: the arm's own summary now against its summary just before its last refresh.
        for arm_index, refresh_stride in enumerate([*arm_refresh, 0]):
            reference = arm_history.get(refresh_stride - 1, arm_first) if refresh_stride > 0 else arm_first
            now = [summary[arm_index] for summary in arm_history[stride]]
            query_drift[arm_index, stride] = _cosine_drift(now, [summary[arm_index] for summary in reference])
        query_drift[-1, stride] = _cosine_drift(full_history[stride], full_first)
    rows = [arms.index(arm if arm in arms else ARM_STAT) for arm in requested_arms]
    return ProbeResult(
        requested_arms,
        outcome[rows],
        entropy[rows],
        query_drift[rows],
        retained_mass[rows],
        None if token_acceptance is None else token_acceptance[rows],
    )
