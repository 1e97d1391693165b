"""Probe collection: one teacher-forced pass over a fixed target response, every arm per stride.

The draft runs over the response stride by stride. A *canonical* cache stores the full draft KV
(full attention): it gives the ``full`` arm, the prefill selection and the retained mass. At every
stride boundary each compressed arm rescores a selection from its *own* history (its stored KV and
its last ``obs_window`` queries, computed under its own working sets, as a closed-loop draft's
refresh does); ``age:N`` uses the selection it made N tokens before the stride, ``stat`` the
prefill selection, ``full`` everything. Each compressed arm keeps its own KV history (and
recurrent state), computed under its own working sets as a closed-loop draft's would be, and all
of them run as one batched forward per stride (batch = arms). Arms whose working sets have been
the same at every stride so far have one history, so they share one row of that batch: every arm
until the first refresh, ``age:N`` with ``stat`` until stride N / stride + 1 (a 32-token probe of
the default arms runs 10 arm-strides, not 16; 256 tokens: 187, not 224). Never a K-step draft
loop: the cost is one pass per distinct history per stride, plus one rescoring of the rows whose
arms will read it (arm N reads a stride's selection N tokens later, if the response lasts that
long). An arm at least as old as
the response's last stride start never refreshes, so it would repeat ``stat``: it is not run, and
its rows are stat's. Several requests can be probed at once (`probe_requests`): their arms'
forwards are stacked along the batch (`rift_ada.batch_cache.StackedArmsCache`), and so are their
canonical passes; rescoring and a separate target's pass stay per request.

Recorded per output position and arm: the outcome a round would see there (T = 0: does the draft's
greedy token equal the target token; T > 0: sum_x min(p_target(x), q_draft(x)), and the acceptance
probability given the response's token x, min(1, q_draft(x) / p_target(x))) and the draft
entropy; per stride and arm: query drift against the arm's last refresh and retained mass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from rift_ada.batch_cache import StackedArmsCache
from rift_ada.budget import CachePolicy
from rift_ada.cache import BudgetedLayer, make_draft_cache
from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT, DEFAULT_ARM_AGES, age_arm
from rift_ada.probe_arms import arm_working_sets, keep_arm_rows, reserve_arm_rows
from rift_ada.speculative import acceptance_given_token, entropy_and_probs, greedy_tokens
from rift_ada.throughput import PROBE_POSITION_BUDGET


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
    arm_rows_run: int = 0  # rows the arms' forwards ran, summed over strides (arms alike share one)


def probe_arms(arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES) -> tuple[str, ...]:
    return tuple(age_arm(age) for age in arm_ages) + (ARM_STAT, ARM_FULL)


def _cosine_drift(now: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """1 - mean over layers and groups of cos(now, reference): (layers, ..., kv, d) query summaries -> (...)."""
    cosine = torch.nn.functional.cosine_similarity(now.float(), reference.float(), dim=-1)
    return 1.0 - cosine.mean(-1).mean(0)


def _forward(
    model: Any, tokens: torch.Tensor, cache: Any, start: int | torch.Tensor, logits_to_keep: int = 0
) -> torch.Tensor:
    """Logits of ``tokens`` (rows, n) fed from position ``start``: one for every row, or (rows,) per row.
    ``logits_to_keep``: only the last so many positions' logits (0: all; a prefill needs none)."""
    offsets = torch.arange(tokens.shape[1], device=tokens.device)
    first = torch.as_tensor(start, device=tokens.device).reshape(-1, 1)
    positions = (first + offsets).expand(tokens.shape[0], -1)
    output = model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return output.logits


def check_probe(
    prompt_ids: Sequence[int], response_ids: Sequence[int], policy: CachePolicy, arm_ages: tuple[int, ...], stride: int
) -> None:
    """Refuse settings the probe cannot run, naming the field (before any forward)."""
    if any(age % stride for age in arm_ages):
        raise ProbeError(f"arm ages {arm_ages} must be multiples of decision_stride={stride}")
    if policy.is_full:
        raise ProbeError("policy: probe arms need a compressed policy (got 'full')")
    if policy.selector.observes_attention:
        raise ProbeError(
            f"policy: probe arms cannot follow {policy.name!r}, whose selection changes with every step's "
            "attention (the arms' forwards record none); probe a prefix or prefill-scored policy"
        )
    if len(prompt_ids) < 2 or not response_ids:
        raise ProbeError("need a prompt of >= 2 tokens and a non-empty response")


class _RequestProbe:
    """One request's probe between strides: its canonical, target and arms caches, histories and outputs.

    A stride is `prepare` (rescoring, the arms' working sets), the arms' forward (run by the caller,
    alone or stacked with other requests' arms) and `finish` (the canonical and target passes, the
    recorded values)."""

    def __init__(
        self,
        draft_model: Any,
        prompt_ids: list[int],
        response_ids: list[int],
        *,
        policy: CachePolicy,
        temperature: float,
        arm_ages: tuple[int, ...],
        decision_stride: int,
        target_model: Any | None,
    ) -> None:
        self.draft_model, self.target_model = draft_model, target_model
        self.temperature, self.decision_stride = temperature, decision_stride
        self.response_ids = response_ids
        device = self.device = next(draft_model.parameters()).device
        self.requested_arms = probe_arms(arm_ages)
        n_out = self.n_out = len(response_ids)
        n_strides = self.n_strides = -(-n_out // decision_stride)
        # An arm at least as old as the last stride's start never refreshes within this response: it
        # reads the prefill selection throughout, as `stat` does, so it is not run and copies stat's rows.
        arm_ages = self.arm_ages = tuple(age for age in arm_ages if age // decision_stride < n_strides - 1)
        arms = self.arms = probe_arms(arm_ages)
        compressed = self.compressed = len(arm_ages) + 1  # the age arms and stat run batched; full is canonical
        self.outcome = np.full((len(arms), n_out), np.nan, dtype=np.float32)
        self.entropy = np.full((len(arms), n_out), np.nan, dtype=np.float32)
        self.query_drift = np.full((len(arms), n_strides), np.nan, dtype=np.float32)
        self.retained_mass = np.full((len(arms), n_strides), np.nan, dtype=np.float32)
        self.token_acceptance = np.full((len(arms), n_out), np.nan, dtype=np.float32) if temperature > 0 else None

        # The canonical cache stores the full draft KV with full attention: it scores the selections,
        # gives the `full` arm and measures retained mass. The arms cache holds one KV history (and one
        # recurrent state, for hybrid models) per compressed arm, each computed under its own working set.
        canonical = self.canonical = make_draft_cache(draft_model, policy)
        canonical.expect_positions(len(prompt_ids) + n_out)  # so every arm's copy of it never grows either
        layers = self.layers = canonical.budgeted_layers
        for layer in layers:
            layer.force_full = True
        self.sequence = torch.tensor([prompt_ids + response_ids], device=device)
        self.start = len(prompt_ids) - 1
        _forward(draft_model, self.sequence[:, : self.start], canonical, 0, logits_to_keep=1)
        self.target_cache = None
        if target_model is not None:
            self.target_cache = DynamicCache(config=target_model.config)
            _forward(target_model, self.sequence[:, : self.start], self.target_cache, 0, logits_to_keep=1)
        for layer in layers:
            layer.pop_query_summary()
            layer.rescore_block = decision_stride  # the prefill window's mass blocks, kept for the arms' rescoring
        self.stat_selection = [layer.compute_selection() for layer in layers]
        # Arms whose working sets have been the same at every stride so far have the same history:
        # they share one row of the arms cache (all of them until the first refresh), so a stride
        # runs one row per distinct history. `arm_rows[i]`: compressed arm i's row; rows are ordered
        # by their first arm.
        arms_cache = self.arms_cache = copy.deepcopy(canonical)
        for layer in layers:  # the canonical cache is not rescored again
            layer.rescore_block = None
            layer.drop_mass_blocks()
        for layer in arms_cache.budgeted_layers:
            layer.force_full = False
            reserve_arm_rows(layer, compressed)
        self.arm_rows = [0] * compressed
        self.rows, self.arm_rows_run = 1, 0
        self.arm_layers = arms_cache.budgeted_layers
        self.stackable = StackedArmsCache.stackable(arms_cache)  # may share a forward with other requests
        for layer in self.arm_layers:  # rescoring reuses each stride's attention mass while it is in the window
            layer.rescore_block = decision_stride

        self.max_age_strides = max(arm_ages, default=0) // decision_stride
        # stride -> (per layer (rows, kv, k) selections, each arm's row then), or None where no arm reads it
        self.history: dict[int, tuple[list[torch.Tensor], list[int]] | None] = {}
        self.arm_history: dict[int, torch.Tensor] = {}  # stride -> (layers, arms, kv, d) query summaries
        self.full_history: dict[int, torch.Tensor] = {}  # stride -> (layers, kv, d) canonical summaries
        self.stride = 0

    @property
    def done(self) -> bool:
        return self.stride >= self.n_strides

    def prepare(self) -> torch.Tensor:
        """Rescore and set the arms' working sets for the next stride; return its tokens, (1, n_new)."""
        stride, decision_stride, arm_ages = self.stride, self.decision_stride, self.arm_ages
        first = stride * decision_stride
        self.n_new = min(decision_stride, self.n_out - first)
        self.position = self.start + first
        self.tokens = self.sequence[:, self.position : self.position + self.n_new]
        # Each age arm refreshes from its own history (its KV and its last obs_window queries, both
        # computed under its own working sets), as a closed-loop draft does: one batched rescoring of
        # the rows. Only the rows of arms that will read this stride's selection rescore: arm i reads
        # it at stride + age_i / decision_stride, if the response lasts that long (`stat` never does).
        read_later = [i for i, age in enumerate(arm_ages) if stride + age // decision_stride < self.n_strides]
        history = self.history
        history[stride] = None
        if stride and read_later:
            rows = slice(0, max(self.arm_rows[i] for i in read_later) + 1)
            history[stride] = ([layer.compute_selection(rows) for layer in self.arm_layers], list(self.arm_rows))
        history.pop(stride - self.max_age_strides - 1, None)
        window_start = max(0, self.position - self.layers[0].window + 1)
        self.arm_refresh = [max(0, stride - age // decision_stride) for age in arm_ages] + [0]  # stat: never
        # An arm's history after this stride: its history before it and the selection it reads now
        # (the prefill's, or the one a row rescored at its refresh stride). Arms alike share a row.
        next_rows: dict[tuple[int, int, int], int] = {}
        parents, selections, arm_rows = [], [], []
        for arm, refresh in enumerate(self.arm_refresh):
            source = history[refresh][1][arm] if refresh else -1
            key = (self.arm_rows[arm], refresh, source)
            if key not in next_rows:
                next_rows[key] = len(parents)
                parents.append(self.arm_rows[arm])
                selections.append(
                    self.stat_selection if refresh == 0 else [chosen[source][None] for chosen in history[refresh][0]]
                )
            arm_rows.append(next_rows[key])
        if parents != list(range(self.rows)):
            self._keep_rows(torch.tensor(parents, device=self.device))
        self.arm_rows, self.rows = arm_rows, len(parents)
        self.arm_rows_run += self.rows
        for index, (layer, arm_layer) in enumerate(zip(self.layers, self.arm_layers, strict=True)):
            working_set = arm_working_sets(layer, [chosen[index] for chosen in selections], window_start)
            arm_layer.arms = working_set
            layer.mass_targets = [working_set]
        return self.tokens

    def _keep_rows(self, parents: torch.Tensor) -> None:
        """Row i of the arms cache becomes a copy of row ``parents[i]`` (every layer's state)."""
        for layer in self.arms_cache.layers:
            if isinstance(layer, BudgetedLayer):
                keep_arm_rows(layer, parents)
            else:
                layer.reorder_cache(parents)

    def finish(self, arm_logits: torch.Tensor, full_logits: torch.Tensor | None = None) -> None:
        """The canonical (and target) pass of the stride and every value recorded for it.

        ``arm_logits`` (rows, n_new, vocab): the arms cache's rows; ``full_logits`` (1, n_new, vocab): the
        canonical pass already run (stacked with other requests')."""
        stride, n_new, position, temperature = self.stride, self.n_new, self.position, self.temperature
        first = stride * self.decision_stride
        layers, arm_history, full_history = self.layers, self.arm_history, self.full_history
        arm_row = torch.tensor(self.arm_rows, device=self.device)
        arm_history[stride] = torch.stack([layer.arm_query_sum for layer in self.arm_layers]).index_select(1, arm_row)
        arm_history[stride] /= n_new
        if full_logits is None:
            full_logits = _forward(self.draft_model, self.tokens, self.canonical, position)
        full_history[stride] = torch.stack([layer.pop_query_summary()[0] for layer in layers])
        for table in (arm_history, full_history):
            table.pop(stride - self.max_age_strides - 2, None)
        if stride == 0:
            self.arm_first, self.full_first = arm_history[0], full_history[0]
        mass = torch.stack([layer.retained for layer in layers]).mean(0).index_select(0, arm_row)
        for layer in layers:
            layer.mass_targets = None
        if self.target_model is not None:
            target_logits = _forward(self.target_model, self.tokens, self.target_cache, position)[0]
        else:
            target_logits = full_logits[0]

        all_logits = torch.cat([arm_logits, full_logits], 0)  # (rows + 1, n_new, vocab): each row once, then full
        n_rows = all_logits.shape[0]
        arm_entropy, arm_probs = entropy_and_probs(all_logits, temperature)
        expected = torch.tensor(self.response_ids[first : first + n_new], device=self.device)
        if temperature > 0:
            target_probs = torch.softmax(target_logits.float() / temperature, -1)
            values = torch.minimum(arm_probs, target_probs[None]).sum(-1)
            # Given the text's token x, rejection sampling accepts the draft with min(p, q)(x) / p(x).
            draft_at_token = arm_probs.gather(-1, expected[None, :, None].expand(n_rows, -1, 1))[..., 0]
            target_at_token = target_probs.gather(-1, expected[:, None])[:, 0]
            given_token = acceptance_given_token(draft_at_token, target_at_token[None])
        else:
            values = (greedy_tokens(all_logits) == expected[None]).float()
        arm_of_row = [*self.arm_rows, self.rows]  # each arm's row of all_logits
        if temperature > 0:
            self.token_acceptance[:, first : first + n_new] = given_token.cpu().numpy()[arm_of_row]
        self.outcome[:, first : first + n_new] = values.cpu().numpy()[arm_of_row]
        self.entropy[:, first : first + n_new] = arm_entropy.cpu().numpy()[arm_of_row]
        self.retained_mass[: self.compressed, stride] = mass.cpu().numpy()
        self.retained_mass[-1, stride] = 1.0
        # Query drift: the arm's own summary now against its summary just before its last refresh.
        references = [
            (arm_history.get(refresh_stride - 1, self.arm_first) if refresh_stride > 0 else self.arm_first)[:, arm]
            for arm, refresh_stride in enumerate(self.arm_refresh)
        ]
        drift = _cosine_drift(arm_history[stride], torch.stack(references, 1))
        self.query_drift[: self.compressed, stride] = drift.cpu().numpy()
        self.query_drift[-1, stride] = float(_cosine_drift(full_history[stride], self.full_first))
        self.stride += 1

    def result(self) -> ProbeResult:
        arms = self.arms
        rows = [arms.index(arm if arm in arms else ARM_STAT) for arm in self.requested_arms]
        acceptance = self.token_acceptance
        return ProbeResult(
            self.requested_arms,
            self.outcome[rows],
            self.entropy[rows],
            self.query_drift[rows],
            self.retained_mass[rows],
            None if acceptance is None else acceptance[rows],
            self.arm_rows_run,
        )


def _arms_forward(draft_model: Any, group: list[_RequestProbe]) -> list[torch.Tensor]:
    """One forward of the group's arms (each request's prepared stride); per request (rows, n_new, vocab)."""
    if len(group) == 1:  # one request: its own arms cache, no stacking
        probe = group[0]
        return [_forward(draft_model, probe.tokens.expand(probe.rows, -1), probe.arms_cache, probe.position)]
    stacked = StackedArmsCache([probe.arms_cache for probe in group])
    tokens = torch.cat([probe.tokens.expand(probe.rows, -1) for probe in group])
    starts = torch.tensor([probe.position for probe in group for _ in range(probe.rows)])
    logits = _forward(draft_model, tokens, stacked, starts)
    stacked.split()
    return list(logits.split([probe.rows for probe in group]))


def _canonical_forward(draft_model: Any, group: list[_RequestProbe]) -> list[torch.Tensor | None]:
    """The group's canonical passes (full attention over each request's stored KV) as one forward;
    per request (1, n_new, vocab), or None for each when they run alone (one request)."""
    if len(group) == 1:
        return [None]
    stacked = StackedArmsCache([probe.canonical for probe in group])
    tokens = torch.cat([probe.tokens for probe in group])
    starts = torch.tensor([probe.position for probe in group])
    logits = _forward(draft_model, tokens, stacked, starts)
    stacked.split()
    return list(logits.split(1))


@torch.no_grad()
def probe_requests(
    draft_model: Any,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    policy: CachePolicy,
    temperature: float = 0.0,
    arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES,
    decision_stride: int = 8,
    target_model: Any | None = None,
    batch_size: int = 1,
    on_tokens: Callable[[int, int], None] | None = None,
    position_budget: int | None = PROBE_POSITION_BUDGET,
) -> Iterator[tuple[int, ProbeResult]]:
    """Probe (prompt, response) requests, up to ``batch_size`` at a time; yield (index, result) as each ends.
    A request joins those in flight only while their prompt and response positions together stay within
    ``position_budget`` (None: no bound; a request alone always runs): each holds every arm's KV of them.

    Each request prefills and runs its canonical pass alone; the arms' forwards of the requests in
    flight whose strides have the same length run as one forward (their arms stacked along the
    batch), and a finished request's slot goes to the next. A request's values are those it gets
    alone, up to the order of float operations in a larger batch. Models with built-in
    sliding-window layers (GPT-OSS) run their arms one request at a time. ``on_tokens(positions,
    strides)`` after every stride of the requests in flight (response positions probed, strides run).
    """
    if batch_size < 1:
        raise ProbeError(f"batch_size must be >= 1, got {batch_size}")
    if position_budget is not None and position_budget < 1:
        raise ProbeError(f"position_budget must be >= 1 or None, got {position_budget}")
    for prompt_ids, response_ids in requests:
        check_probe(prompt_ids, response_ids, policy, arm_ages, decision_stride)
    waiting = list(enumerate(requests))[::-1]
    active: list[tuple[int, _RequestProbe]] = []
    settings = dict(
        policy=policy,
        temperature=temperature,
        arm_ages=arm_ages,
        decision_stride=decision_stride,
        target_model=target_model,
    )
    while waiting or active:
        held = sum(probe.sequence.shape[1] for _, probe in active)
        while waiting and len(active) < batch_size:
            index, (prompt_ids, response_ids) = waiting[-1]
            positions = len(prompt_ids) + len(response_ids)
            if active and position_budget is not None and held + positions > position_budget:
                break
            waiting.pop()
            held += positions
            active.append((index, _RequestProbe(draft_model, list(prompt_ids), list(response_ids), **settings)))
        groups: dict[int, list[_RequestProbe]] = {}
        for _, probe in active:
            probe.prepare()
            groups.setdefault(probe.n_new if probe.stackable else -id(probe), []).append(probe)
        for group in groups.values():
            arm_logits = _arms_forward(draft_model, group)
            full_logits = _canonical_forward(draft_model, group)
            for probe, arms, full in zip(group, arm_logits, full_logits, strict=True):
                probe.finish(arms, full)
        if on_tokens is not None:
            on_tokens(sum(probe.n_new for _, probe in active), len(active))
        for index, probe in [item for item in active if item[1].done]:
            yield index, probe.result()
        active = [item for item in active if not item[1].done]


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
    results = probe_requests(
        draft_model,
        [(prompt_ids, response_ids)],
        policy=policy,
        temperature=temperature,
        arm_ages=arm_ages,
        decision_stride=decision_stride,
        target_model=target_model,
    )
    return next(iter(results))[1]
