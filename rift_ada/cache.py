"""A budgeted draft KV cache for Hugging Face transformers (5.x).

In every full-attention layer, `BudgetedLayer` stores the full draft KV (so the selection can be
rescored) and hands attention exactly the working set: per KV head, a selection of at most k
positions plus the window of the r most recent positions. Linear-attention (Qwen3.5 Gated
DeltaNet), Mamba (Nemotron-H) and built-in sliding-window layers (GPT-OSS) keep their ordinary
transformers cache layers, untouched.

Prefill runs with full attention (SnapKV needs it); the selection is made from the prefill's last
``obs_window`` queries at the first forward after it. Batch size 1 is what the draft/verify loop
uses; larger batches work for the probe's arms (see `BudgetedCache.run_arms`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from rift_ada.attention import PendingAttention, group_query_mean, install, set_pending
from rift_ada.budget import CachePolicy, make_policy, validate
from rift_ada.probe_arms import ArmWorkingSets, arms_retained_mass, layers_query_summary, layers_retained_mass
from rift_ada.scorers.inputs import ScoreInputs
from rift_ada.scorers.registry import make_scorer
from rift_ada.scorers.rope import RopeRotation, find_rope
from rift_ada.scorers.snapkv import SnapKVScorer
from rift_ada.selections import prefix_positions


class CacheError(ValueError):
    """The model or the cache cannot be used as asked."""


@dataclass
class LayerState:
    """What a rollback restores for one budgeted layer."""

    length: int
    selection: torch.Tensor
    query_buffer: torch.Tensor | None
    query_positions: torch.Tensor | None
    query_sum: torch.Tensor | None
    query_count: int
    heavy_scores: torch.Tensor | None


def grown_capacity(capacity: int, needed: int) -> int:
    return max(needed, 2 * capacity)


def grow_positions(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    """``tensor`` (b, kv, n, ...) zero-padded along the positions (dim 2) to ``capacity``."""
    shape = list(tensor.shape)
    shape[2] = capacity - tensor.shape[2]
    return torch.cat([tensor, tensor.new_zeros(shape)], 2)


def gather_positions(stored: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``stored[b, h, positions[b, h, j]]``: (b, h, k, d) from (b, h, n, d) ``stored`` and (b, h, k) ``positions``,
    into ``out`` where given. Each position is one row of d values, so a contiguous ``stored`` is read with one
    index_select over its (b * h * n, d) rows: about 10x torch.gather's per-element copy at the probe's and the
    draft's working-set sizes (the same values)."""
    batch, heads, length, dim = stored.shape
    if not stored.is_contiguous():
        index = positions[..., None].expand(-1, -1, -1, dim)
        return torch.gather(stored, 2, index) if out is None else torch.gather(stored, 2, index, out=out)
    offsets = torch.arange(0, batch * heads * length, length, device=positions.device).view(batch, heads, 1)
    rows = (positions + offsets).reshape(-1)
    if out is None:
        return stored.view(-1, dim).index_select(0, rows).view(*positions.shape, dim)
    if out.is_contiguous():
        torch.index_select(stored.view(-1, dim), 0, rows, out=out.view(-1, dim))
    else:
        out.copy_(stored.view(-1, dim).index_select(0, rows).view(*positions.shape, dim))
    return out


class BudgetedLayer(DynamicLayer):
    """Full stored KV plus a per-head working set of at most ``policy.budget`` positions."""

    def __init__(
        self,
        policy: CachePolicy,
        layer_idx: int,
        scaling: float,
        sinks: torch.Tensor | None = None,
        rope: RopeRotation | None = None,
        output_weight: torch.Tensor | None = None,
    ):
        super().__init__()
        self.policy = policy
        self.selector = policy.selector  # chooses the positions (`rift_ada.selections`); the layer stores them
        self.layer_idx = layer_idx
        self.scaling = scaling
        self.sinks = sinks
        self.rope = rope  # the model's rotary embedding (scorers that move queries in position)
        self.output_weight = output_weight  # the attention's o_proj weight (CriticalKV)
        self.length = 0
        self.prefilled = False
        self.selection: torch.Tensor | None = None  # (b, kv, m) positions, sorted
        self.query_buffer: torch.Tensor | None = None  # (b, h, <=w, d) post-RoPE
        self.query_positions: torch.Tensor | None = None  # (<=w,)
        self.query_sum: torch.Tensor | None = None  # (b, kv, d) pre-RoPE, since last pop
        self.query_count = 0
        self.heavy_scores: torch.Tensor | None = None  # (b, kv, capacity): H2O's accumulated attention
        # the probe (`rift_ada.probe_arms`): batch = arms, each with its working set; the canonical pass's targets
        self.arms: ArmWorkingSets | None = None
        self.arm_query_sum: torch.Tensor | None = None  # probe: (A, kv, d) of the last arms pass
        self.mass_targets: list[ArmWorkingSets] | None = None
        self.retained: torch.Tensor | None = None  # probe: (A,) retained mass of the last canonical pass
        self.force_full = False  # probe: the canonical pass attends to everything and stores it
        self.arm_buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # probe: room for every arm's KV
        # False: forwards past the prefill record no queries (a target's cache, whose summaries nobody reads,
        # or draft steps that a rollback discards anyway: `BatchedCache.keep_queries`)
        self.keeps_queries = True
        self._window, self._capacity = self.selector.window, self.selector.selected  # read on every step
        self.initial_capacity = 256  # positions allocated at the first forward (`BudgetedCache.expect_positions`)
        self._gathered: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None  # selection, K, V, end
        self._ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # selection, K, V (single steps)
        self._ring_length = -1  # stored length the ring matches; -1: rebuild before use
        self.scorer = make_scorer(policy.scorer, policy.obs_window, policy.pool_kernel)
        self._mass = SnapKVScorer(policy.obs_window, policy.pool_kernel)  # the query window's attention mass
        # probe: the query window's attention mass is summed from blocks of this many queries, each
        # computed once (keys and queries only grow there); None: the whole window at every rescoring
        self.rescore_block: int | None = None
        self._mass_blocks: dict[int, torch.Tensor] = {}  # first query position -> (rows, kv, group, n then)

    def __deepcopy__(self, memo: dict[int, Any]) -> BudgetedLayer:
        """A copy with its own state (stored KV, selection, query buffer) that still reads the model's own
        ``rope``, ``output_weight`` and ``sinks`` (a copied cache serves the same model)."""
        for owned in (self.rope, self.output_weight, self.sinks):
            if owned is not None:
                memo.setdefault(id(owned), owned)
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    # ---- storage ---------------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, n_kv, _, head_dim = key_states.shape
        capacity = self.initial_capacity
        self.keys = key_states.new_zeros(batch, n_kv, capacity, head_dim)
        self.values = value_states.new_zeros(batch, n_kv, capacity, value_states.shape[-1])
        self.is_initialized = True

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` stored positions (at least doubling the capacity when it grows)."""
        if needed > self.keys.shape[2]:
            capacity = grown_capacity(self.keys.shape[2], needed)
            self.keys, self.values = grow_positions(self.keys, capacity), grow_positions(self.values, capacity)
        self.fit_scores(self.keys.shape[2])

    def fit_scores(self, capacity: int) -> None:
        """Keep H2O's accumulated scores as long as the stored KV."""
        if self.heavy_scores is not None and self.heavy_scores.shape[2] < capacity:
            self.heavy_scores = grow_positions(self.heavy_scores, capacity)

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        needed = self.length + key_states.shape[2]
        self.reserve(needed)
        if self._gathered is not None and self.length < self._gathered[3]:
            self._gathered = self._ring = None  # a selected position is written again (a rollback went below it)
        self.keys[:, :, self.length : needed] = key_states
        self.values[:, :, self.length : needed] = value_states
        self.length = needed

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def stored_keys(self) -> torch.Tensor:
        return self.keys[:, :, : self.length]

    # ---- working set -----------------------------------------------------------------------
    @property
    def window(self) -> int:
        return self._window

    @property
    def capacity(self) -> int:
        return self._capacity

    def working_set(self, query_position: int | None = None) -> list[list[int]]:
        """Positions a query at ``query_position`` (default: the next one) attends to, per KV head (batch 0)."""
        position = self.length if query_position is None else query_position
        if self.selector.full or self.force_full or not self.prefilled:
            return [list(range(position + 1)) for _ in range(self.keys.shape[1])]
        window = set(range(max(0, position - self.window + 1), position + 1))
        result = []
        for head in range(self.keys.shape[1]):
            chosen = set(self.selection[0, head].tolist())
            if self.is_unfilled():
                chosen |= set(range(min(self.capacity, position + 1)))
            result.append(sorted(chosen | window))
        return result

    def is_unfilled(self) -> bool:
        """An unfilled selection: it keeps absorbing positions as they leave the window."""
        return self.selector.absorbs_prefix and self.selection.shape[-1] < self.capacity

    def _candidates_end(self, next_position: int) -> int:
        """Positions [0, end) lie outside the window of a query at ``next_position``."""
        return max(0, next_position - self.window + 1)

    def compute_selection(self, rows: slice = slice(None)) -> torch.Tensor:
        """The selection a refresh would choose now, for a query at position ``self.length``.

        ``rows``: score only these batch rows (the probe skips arms whose selection it won't read).
        """
        return self.selector.select(self, rows, self._candidates_end(self.length))

    def score_inputs(self, rows: slice = slice(None), candidates: int | None = None) -> ScoreInputs:
        """What the policy's scorer reads to rescore the stored positions of ``rows`` now."""
        return ScoreInputs(
            keys=self.stored_keys()[rows],
            values=self.values[rows, :, : self.length],
            queries=self.query_buffer[rows],
            query_positions=self.query_positions,
            next_position=self.length,
            scaling=self.scaling,
            selected=self.capacity,
            candidates=self._candidates_end(self.length) if candidates is None else candidates,
            window_mass=lambda: self._window_mass(rows),
            sinks=self.sinks,
            rope=self.rope,
            output_weight=self.output_weight,
        )

    def _window_mass(self, rows: slice) -> torch.Tensor:
        """SnapKV attention mass of the query window, (rows, kv, group, length).

        With ``rescore_block`` (the probe's decision stride) and a window of whole blocks ending at
        the last stored position, the mass of each block is computed once and kept: the window
        slides by a block per stride, so one block is new and the rest are sums already made. The
        total equals the whole window's up to the order of float additions. With no block kept yet
        the whole window is one product, whose total is the one without blocks, bit for bit, and
        whose blocks are kept from it (a copy of the layer, as the probe's arms cache, reuses them).
        """
        queries, keys, positions = self.query_buffer[rows], self.stored_keys()[rows], self.query_positions
        block = self.rescore_block
        n_queries = len(positions)
        first = self.length - n_queries
        n_rows = keys.shape[0]
        if (
            block is None
            or n_queries % block
            or rows.start not in (None, 0)
            or rows.step not in (None, 1)
            or int(positions[0]) != first
            or int(positions[-1]) != self.length - 1
        ):
            return self._mass.attention_mass(queries, keys, positions, self.scaling, self.sinks)
        self._mass_blocks = {start: mass for start, mass in self._mass_blocks.items() if start >= first}
        if not self._mass_blocks:
            probs = self._mass.attention_probs(queries, keys, positions, self.scaling, self.sinks)
            for offset in range(0, n_queries, block):
                self._mass_blocks[first + offset] = probs[:, :, :, offset : offset + block].sum(dim=3)
            return probs.sum(dim=3)
        total = None
        for offset in range(0, n_queries, block):
            start = first + offset
            mass = self._mass_blocks.get(start)
            if mass is None or mass.shape[0] < n_rows:
                part = slice(offset, offset + block)
                mass = self._mass.attention_mass(queries[:, :, part], keys, positions[part], self.scaling, self.sinks)
                self._mass_blocks[start] = mass
            mass = mass[:n_rows]
            if total is None:
                total = keys.new_zeros(*mass.shape[:3], self.length, dtype=torch.float32)
            total[..., : mass.shape[-1]] += mass
        return total

    def keep_mass_rows(self, parents: torch.Tensor) -> None:
        """The kept attention-mass blocks of rows that become copies of rows ``parents`` (the probe's arms parting):
        a block holds rows [0, n), so it keeps the leading new rows whose parents it has (the rest are recomputed)."""
        parent_rows = parents.tolist()
        kept_rows: dict[int, int] = {}  # rows a block holds -> leading new rows whose parents it holds
        blocks = {}
        for start, mass in self._mass_blocks.items():
            held = mass.shape[0]
            if held not in kept_rows:
                kept_rows[held] = next((i for i, parent in enumerate(parent_rows) if parent >= held), len(parent_rows))
            if kept_rows[held]:
                blocks[start] = mass.index_select(0, parents[: kept_rows[held]])
        self._mass_blocks = blocks

    def drop_mass_blocks(self) -> None:
        """Forget the kept attention-mass blocks (`_window_mass`); the next rescoring computes its window anew."""
        self._mass_blocks = {}

    def _select(self) -> None:
        self.selection = self.compute_selection()

    def refresh(self) -> None:
        """Rescore every stored position outside the window with the latest queries (RIFT-dyn)."""
        if self.selector.prefill_scored and self.prefilled and self.query_buffer is not None:
            self._select()

    # ---- the update called by the attention module ---------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states[:1], value_states[:1])
        if self.arms is not None:
            return self._update_arms(key_states, value_states)
        first = self.length
        n_new = key_states.shape[2]
        full = self.selector.full or self.force_full
        if self.prefilled and self.selection is None and not full:
            self._select()
        if self.length == 0 and not self.prefilled:
            self._append(key_states, value_states)
            set_pending(self.layer_idx, PendingAttention(self, first, n_new, full=True))
            return self.stored_keys(), self.values[:, :, : self.length]
        self._append(key_states, value_states)
        if full:
            set_pending(self.layer_idx, PendingAttention(self, first, n_new, full=True))
            return self.stored_keys(), self.values[:, :, : self.length]
        window_start = max(0, first - self.window + 1)
        selection = self.selection
        prefix_limit = None
        if self.is_unfilled():
            selection = prefix_positions(self, min(self.capacity, window_start))
            prefix_limit = torch.tensor([self.capacity], device=self.keys.device)
        key_positions = None
        if self.selector.observes_attention:  # its attention is credited to the positions it lands on
            window_positions = torch.arange(window_start, self.length, device=self.keys.device)
            key_positions = torch.cat([selection, window_positions.expand(*selection.shape[:2], -1)], -1)
        elif n_new == 1 and prefix_limit is None and first + 1 >= self.window:
            return self._ring_working_set(selection, first, window_start)
        self._ring_length = -1
        return self._working_set(
            selection, first, n_new, window_start, prefix_limit=prefix_limit, key_positions=key_positions
        )

    def _ring_working_set(
        self, selection: torch.Tensor, first: int, window_start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A single-token step's [selection | window] kept in one buffer between steps.

        The window part is a ring: position p lives in slot p mod r, so the new token overwrites
        the position that leaves the window and a step copies one key instead of B. A single
        query sees every key of its working set, so the order of the keys does not matter. The
        buffer is rebuilt after a refresh, a multi-token forward or a rollback."""
        window = self.window
        ring = self._ring
        if ring is None or ring[0] is not selection or self._ring_length != first:
            selected_keys, selected_values = self._selected_kv(selection, prefix=False)
            shift = window_start % window
            keys = torch.cat([selected_keys, torch.roll(self.keys[:, :, window_start : self.length], shift, 2)], 2)
            values = torch.cat(
                [selected_values, torch.roll(self.values[:, :, window_start : self.length], shift, 2)], 2
            )
            ring = self._ring = (selection, keys, values)
        else:
            slot = selection.shape[-1] + first % window
            ring[1][:, :, slot] = self.keys[:, :, first]
            ring[2][:, :, slot] = self.values[:, :, first]
        self._ring_length = self.length
        set_pending(self.layer_idx, self._ring_note(first))
        return ring[1], ring[2]

    def _ring_note(self, first: int) -> PendingAttention:
        window_start = max(0, first - self.window + 1)
        n_selected = self.selection.shape[-1]
        return PendingAttention(
            self, first, 1, full=False, window=self.window, window_start=window_start, n_selected=n_selected
        )

    def ring_step_slot(self) -> int | None:
        """The ring slot the next single-token step writes when that write (and the stored KV's) is all
        the step changes, i.e. `update` would take the ring path with a current ring; else None."""
        ring = self._ring
        if ring is None or ring[0] is not self.selection or self._ring_length != self.length:
            return None
        return self.selection.shape[-1] + self.length % self.window if self._steps_take_ring() else None

    def _steps_take_ring(self) -> bool:
        """Whether the next single-token step takes `update`'s ring path (`_ring_working_set`)."""
        return not (
            self.selection is None
            or self.arms is not None
            or self.force_full
            or self.selector.full
            or self.selector.observes_attention
            or not self.prefilled
            or self.is_unfilled()
            or self.length + 1 < self.window
        )

    def _write_window_slots(self, keys: torch.Tensor, values: torch.Tensor, low: int, high: int) -> None:
        """Stored positions [low, high) into their slots of a ring buffer: position p at n_selected + p mod r."""
        slots = self.selection.shape[-1] + torch.arange(low, high, device=self.keys.device) % self.window
        keys[:, :, slots], values[:, :, slots] = self.keys[:, :, low:high], self.values[:, :, low:high]

    def ring_step_done(self) -> PendingAttention | None:
        """Bookkeeping of a single-token step whose key and value a batch wrote into the stored KV
        and the ring (at `ring_step_slot`): what `update` does besides those writes. Returns the
        attention note, or None when the step records no queries (its single query needs no mask)."""
        first = self.length
        self.length = self._ring_length = first + 1
        return self._ring_note(first) if self.wants_queries() else None

    def rebuild_ring_in(self, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Rebuild the [selection | window ring] buffer into ``keys``/``values`` (e.g. this row's slot of
        a batch buffer) as it stands before the next single-token step, so that step is a ring step
        (`ring_step_slot`) even after a refresh or a restore. False, with nothing changed, where the
        step would not take the ring path or the buffer is not this row's width."""
        selection, length = self.selection, self.length
        if not self._steps_take_ring() or selection.shape[-1] + self.window != keys.shape[2]:
            return False
        selected_keys, selected_values = self._selected_kv(selection, prefix=False)
        if self._gathered is not None and length < self._gathered[3]:  # the step writes over a selected position
            return False
        n_selected = selection.shape[-1]
        keys[:, :, :n_selected], values[:, :, :n_selected] = selected_keys, selected_values
        # the step overwrites position length - window (in slot length % window)
        self._write_window_slots(keys, values, max(0, length - self.window), length)
        self._ring = (selection, keys, values)
        self._ring_length = length
        return True

    def ring_keys(self) -> torch.Tensor | None:
        """The keys of the [selection | window ring] buffer (None: no ring yet)."""
        return None if self._ring is None else self._ring[1]

    def adopt_ring(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep the ring in ``keys``/``values`` (same contents, e.g. a row of a batch's buffer) from now on."""
        self._ring = (self._ring[0], keys, values)

    def _update_arms(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """Probe pass: batch = arms, each arm with its own stored KV history and working set."""
        first, n_new = self.length, key_states.shape[2]
        if self.keys.shape[0] != key_states.shape[0]:
            raise CacheError(
                f"probe arms: cache holds {self.keys.shape[0]} arm histories, got batch {key_states.shape[0]}"
            )
        self._append(key_states, value_states)
        window_start = max(0, first - self.window + 1)
        return self._working_set(
            self.arms.selection,
            first,
            n_new,
            window_start,
            out=out,
            selection_valid=self.arms.valid,
            prefix_limit=self.arms.prefix_limit,
        )

    def arm_set_size(self, n_new: int) -> int:
        """Keys in each probe arm's working set once the next ``n_new`` tokens are stored: its selection
        slots, then the window up to the last of them."""
        return self.arms.selection.shape[-1] + self.length + n_new - max(0, self.length - self.window + 1)

    def update_arms_into(
        self, key_states: torch.Tensor, value_states: torch.Tensor, keys_out: torch.Tensor, values_out: torch.Tensor
    ) -> None:
        """`update` of a probe-arms layer that writes the arms' working sets into ``keys_out`` / ``values_out``
        ((arms, kv, `arm_set_size`, d), views of a stacked forward's buffers) instead of new tensors."""
        if self.arms is None:
            raise CacheError("update_arms_into: the layer holds no probe arms")
        self._update_arms(key_states, value_states, out=(keys_out, values_out))

    def _selected_kv(self, selection: torch.Tensor, prefix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``selection``: a slice for a prefix, else gathered once per selection and
        kept until the selection changes (a refresh) or a position it holds is written again."""
        if prefix:
            count = selection.shape[-1]
            return self.keys[:, :, :count], self.values[:, :, :count]
        cached = self._gathered
        if cached is not None and cached[0] is selection:
            return cached[1], cached[2]
        keys, values = gather_positions(self.keys, selection), gather_positions(self.values, selection)
        if self.arms is None:
            end = int(selection.max()) + 1 if selection.numel() else 0
            self._gathered = (selection, keys, values, end)
        return keys, values

    def _working_set(
        self,
        selection: torch.Tensor,
        first: int,
        n_new: int,
        window_start: int,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
        **mask_fields: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[selection | window] keys and values, and the attention note describing them. ``out``: (keys,
        values) to write them into (probe arms: gathered there directly, no tensor of their own)."""
        prefix = mask_fields.get("prefix_limit") is not None and self.arms is None
        if out is None:
            selected_keys, selected_values = self._selected_kv(selection, prefix)
            keys = torch.cat([selected_keys, self.keys[:, :, window_start : self.length]], 2)
            values = torch.cat([selected_values, self.values[:, :, window_start : self.length]], 2)
        else:
            keys, values = out
            window = torch.arange(window_start, self.length, device=selection.device)
            positions = torch.cat([selection, window.expand(*selection.shape[:2], -1)], -1)
            gather_positions(self.keys, positions, out=keys)
            gather_positions(self.values, positions, out=values)
        pending = PendingAttention(
            self,
            first,
            n_new,
            full=False,
            window=self.window,
            window_start=window_start,
            n_selected=selection.shape[-1],
            **mask_fields,
        )
        set_pending(self.layer_idx, pending)
        return keys, values

    # ---- called from the attention function ------------------------------------------------
    def needs_probs(self, pending: PendingAttention) -> bool:
        """Whether this forward's attention probabilities are needed (H2O scores, retained mass)."""
        return self.selector.observes_attention and self.arms is None

    def wants_full_probs(self, pending: PendingAttention) -> bool:
        return self.mass_targets is not None and self.prefilled

    def attends_everything(self, n_new: int = 0) -> bool:
        """Each of the next ``n_new`` queries sees every stored key up to itself: a prefilled full-policy
        layer outside the probe, or a window-only one (``swa``, a model's own sliding window) whose
        window still holds every position up to the last of them."""
        if not self.prefilled or self.arms is not None or self.mass_targets is not None:
            return False
        if self.selector.full:
            return True
        return self._capacity == 0 and not self.selector.observes_attention and self.length + n_new <= self._window

    def wants_queries(self) -> bool:
        """Whether the next forward's queries must reach `record_queries` (the prefill's always do)."""
        return self.keeps_queries or not self.prefilled

    def record_queries(
        self,
        query: torch.Tensor,
        pre_rope_query: torch.Tensor | None,
        pending: PendingAttention,
        group_mean: torch.Tensor | None = None,
    ) -> None:
        """Keep the latest ``obs_window`` post-RoPE queries (for rescoring; a full policy never rescores,
        so it keeps none) and the pre-RoPE query sum per group. ``group_mean``: `group_query_mean`
        of ``pre_rope_query`` when the caller has it (a batch computes it once for all rows).
        Callers skip it when `wants_queries` is False."""
        n_queries, n_kv = query.shape[2], self.keys.shape[1]
        if group_mean is None:
            group_mean = group_query_mean(pre_rope_query, n_kv)
        grouped_sum = group_mean.sum(2)
        if not self.selector.full:  # probe arms keep theirs too: each arm's own queries score its own refreshes
            positions = torch.arange(pending.first_position, pending.first_position + n_queries, device=query.device)
            if self.query_buffer is None:  # a copy: the prefill's queries are a view of every prompt position's
                self.query_buffer, self.query_positions = query[:, :, -self.policy.obs_window :].clone(), positions
            else:
                self.query_buffer = torch.cat([self.query_buffer, query], 2)
                self.query_positions = torch.cat([self.query_positions, positions])
            self.query_buffer = self.query_buffer[:, :, -self.policy.obs_window :]
            self.query_positions = self.query_positions[-self.policy.obs_window :]
        if self.arms is not None:
            self.arm_query_sum = grouped_sum
            return
        self.query_sum = grouped_sum if self.query_sum is None else self.query_sum + grouped_sum
        self.query_count += n_queries
        if not self.prefilled:
            self.selector.on_prefill(self, query)
            self.prefilled = True
            self.selection = None  # chosen lazily at the next update, once the prefill is complete

    def observe_attention(self, probs: torch.Tensor, pending: PendingAttention) -> None:
        """Per-step bookkeeping that needs the attention probabilities (H2O, retained mass)."""
        if self.arms is not None:
            return
        if pending.full and self.mass_targets is not None:
            self.retained = arms_retained_mass(self, probs, pending, self.mass_targets)
            return
        if self.selector.observes_attention and not pending.full:
            self.selector.observe(self, probs, pending)

    # ---- bookkeeping for the draft/verify loop -----------------------------------------------
    def pop_query_summary(self) -> torch.Tensor | None:
        """Mean pre-RoPE query per KV group (b, kv, d) since the last pop."""
        if self.query_sum is None or self.query_count == 0:
            return None
        summary = self.query_sum / self.query_count
        self.query_sum, self.query_count = None, 0
        return summary

    def snapshot(self) -> LayerState:
        return LayerState(
            self.length,
            self.selection,
            self.query_buffer,
            self.query_positions,
            self.query_sum,
            self.query_count,
            None if self.heavy_scores is None else self.heavy_scores[:, :, : self.length].clone(),
        )

    def restore(self, state: LayerState) -> None:
        self._ring_length = -1
        self.length = state.length
        self.selection = state.selection
        self.query_buffer, self.query_positions = state.query_buffer, state.query_positions
        self.query_sum, self.query_count = state.query_sum, state.query_count
        if state.heavy_scores is not None:
            self.heavy_scores[:, :, state.length :] = 0
            self.heavy_scores[:, :, : state.length] = state.heavy_scores

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)

    def roll_back_to(self, length: int) -> None:
        """Keep the first ``length`` stored positions: what a round's rejected draft steps wrote leaves
        (their queries were never recorded). The window ring, whose slots those steps wrote over, is
        repaired in place rather than rebuilt: the slots of positions the next step's window still holds
        get their keys and values back from the stored KV (at most one per dropped step)."""
        ring, end, window = self._ring, self._ring_length, self.window
        self.length = length
        if ring is None or end < length or ring[0] is not self.selection:
            self._ring_length = -1
            return
        # the ring holds positions end - window .. end - 1; those below end - window it no longer has
        low, high = max(0, length - window + 1), min(end - window, length)
        if high > low:
            self._write_window_slots(ring[1], ring[2], low, high)
        self._ring_length = length

    def reset(self) -> None:
        self.__init__(  # type: ignore[misc]
            self.policy, self.layer_idx, self.scaling, self.sinks, self.rope, self.output_weight
        )


def full_attention_layer_indices(model: torch.nn.Module) -> list[int]:
    """Indices of layers whose transformers cache layer is a plain full-attention DynamicLayer."""
    probe = DynamicCache(config=model.config)
    return [index for index, layer in enumerate(probe.layers) if type(layer) is DynamicLayer]


def _attention_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    modules = {}
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "scaling") and hasattr(module, "config"):
            modules.setdefault(module.layer_idx, module)
    return modules


class BudgetedLayers:
    """What a refresh hook calls on a draft cache: refresh, query summary, retained mass. A cache or a
    batch row's view provides ``budgeted_layers`` (`BudgetedCache`, `batch_cache.RowCache`)."""

    budgeted_layers: list[BudgetedLayer]

    def refresh(self) -> None:
        """Rescore the full stored draft KV in every budgeted layer (RIFT-dyn / RIFT-ada refresh)."""
        for layer in self.budgeted_layers:
            layer.refresh()

    def query_summary(self) -> list[list[list[float]]] | None:
        """Per full-attention layer, per KV group: mean pre-RoPE query since the last call."""
        return layers_query_summary(self.budgeted_layers)

    def retained_mass(self, n_queries: int = 8) -> float:
        """Share of full-KV attention that the current working sets hold (mean over layers, heads, queries)."""
        return layers_retained_mass(self.budgeted_layers, n_queries)


class BudgetedCache(BudgetedLayers, DynamicCache):
    """A transformers cache whose full-attention layers are `BudgetedLayer`s.

    Build it with `make_draft_cache(model, policy)`. Other layers are the ones transformers
    itself would create for the model, so their state is bit-identical to a plain cache.
    """

    def __init__(self, model: torch.nn.Module, policy: CachePolicy):
        super().__init__(config=model.config)
        self.policy = validate(policy)
        indices = full_attention_layer_indices(model)
        if not indices:
            raise CacheError(
                f"{type(model).__name__} has no full-attention layers: there is no KV to budget "
                "(every layer is linear attention, Mamba or sliding window)"
            )
        modules = _attention_modules(model)
        self.budgeted_indices = indices
        self.window_indices: list[int] = []  # built-in sliding-window layers served by an swa BudgetedLayer
        rope = find_rope(model, modules[indices[0]]) if indices[0] in modules else None  # one for all layers
        for index in indices:
            module = modules.get(index)
            if module is None:
                raise CacheError(f"cannot find the attention module of full-attention layer {index}")
            output = getattr(module, "o_proj", None)
            self.layers[index] = BudgetedLayer(
                policy,
                index,
                float(module.scaling),
                getattr(module, "sinks", None),
                rope=rope,
                output_weight=None if output is None else output.weight,
            )

    @property
    def budgeted_layers(self) -> list[BudgetedLayer]:
        return [self.layers[index] for index in self.budgeted_indices]

    def own_sliding_windows(self, model: torch.nn.Module) -> None:
        """Serve built-in sliding-window layers (GPT-OSS) from `BudgetedLayer`s with an ``swa`` policy of
        the same window: the same attention (a query at p sees (p - W, p], sink logits included),
        but with per-request lengths, which a batch of requests at different positions needs.
        Call it on an empty cache. They are no budgeted layers: no selection, refresh or summary."""
        modules = _attention_modules(model)
        for index, layer in enumerate(self.layers):
            if type(layer) is DynamicSlidingWindowLayer:
                if layer.is_initialized:
                    raise CacheError("own_sliding_windows: call it before the first forward")
                module = modules[index]
                window = make_policy("swa", budget=int(layer.sliding_window))
                self.layers[index] = BudgetedLayer(window, index, float(module.scaling), getattr(module, "sinks", None))
                self.window_indices.append(index)

    def expect_positions(self, positions: int) -> None:
        """Allocate room for ``positions`` stored positions at the first forward (a request whose length
        is known), so the stored KV never grows: growing doubles it and copies it. Call it before the prefill."""
        for layer in self.layers:
            if isinstance(layer, BudgetedLayer):
                if layer.is_initialized:
                    raise CacheError("expect_positions: call it before the first forward")
                layer.initial_capacity = max(layer.initial_capacity, positions)

    def snapshot(self) -> list[Any]:
        """State to roll the cache back to (rejected draft tokens must leave the cache)."""
        return snapshot_cache(self)

    def restore(self, states: list[Any]) -> None:
        restore_cache(self, states)


def make_draft_cache(model: torch.nn.Module, policy: CachePolicy) -> BudgetedCache:
    """A budgeted cache for ``model``; routes the model's attention through rift-ada (idempotent)."""
    install(model)
    return BudgetedCache(model, policy)


def snapshot_cache(cache: DynamicCache) -> list[Any]:
    """Cheap rollback state per layer: a budgeted layer's own snapshot, a length for plain
    full-attention layers (cropped back), a copy of anything else (recurrent, sliding-window)."""
    states: list[Any] = []
    for layer in cache.layers:
        if isinstance(layer, BudgetedLayer):
            states.append(layer.snapshot())
        elif type(layer) is DynamicLayer:
            states.append(layer.get_seq_length())
        else:
            states.append(copy.deepcopy(layer))
    return states


def restore_cache(cache: DynamicCache, states: list[Any]) -> None:
    """Roll a cache back to a `snapshot_cache` state."""
    for index, (layer, state) in enumerate(zip(cache.layers, states, strict=True)):
        if isinstance(layer, BudgetedLayer):
            layer.restore(state)
        elif isinstance(state, int):
            layer.crop(state - layer.get_seq_length())
        else:
            cache.layers[index] = copy.deepcopy(state)
