"""A batch of requests in one transformers cache: per request its own length, selection, window and policy.

Design (ragged lengths): **per-row state over one storage, per-row masks.** Each request (row) of
a full-attention layer is its own batch-1 `BudgetedLayer` (own length, selection, window, query
buffer, H2O scores, policy), so everything a request does alone it does the same way in a batch,
and refreshing row i touches row i only; the rows' stored KV are views of one (batch, kv,
capacity, d) tensor. A batched forward feeds every row the same number of token slots with
per-row position ids; `counts[i]` of them are real (the rest are right padding). Full-policy rows
(the target) are appended by index and attend over the shared storage; single-token draft steps
with current rings write into a batch ring buffer; otherwise each row's `update` gathers its
working set and the sets are padded and stacked (`BatchedLayer`). The attention function masks
per row: a real query sees its row's band (window + selection, or everything up to itself for
full rows), padding sees one dummy key and its output is ignored.

Layers that are not budgeted (Qwen3.5 Gated DeltaNet, Nemotron-H Mamba) keep transformers' own
batched states. A recurrent state cannot skip padding, so a ragged forward on a model with such
layers runs once per distinct length, and rows outside the group get their recurrent state put
back afterwards (`forward_rows`). Built-in sliding-window layers (GPT-OSS) are served by per-row
`swa` BudgetedLayers of the same window (`BudgetedCache.own_sliding_windows`), because
transformers' own sliding-window layer masks by one position common to the whole batch.

Requests prefill alone (exactly as a single request does), then join: `BatchedCache.join`, or
`BatchedCache.add_rows` while the batch runs. Finished requests leave: `BatchedCache.keep_rows`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from rift_ada.attention import (
    BatchPending,
    PendingAttention,
    QueryLog,
    group_query_mean,
    pop_pending,
    set_pending,
    span_slices,
)
from rift_ada.cache import (
    BudgetedCache,
    BudgetedLayer,
    BudgetedLayers,
    CacheError,
    grow_positions,
    grown_capacity,
)


class BatchedLayer(DynamicLayer):
    """One full-attention layer of a batch: a batch-1 `BudgetedLayer` per row, over one shared storage.

    The rows' stored KV live in one (batch, kv, capacity, d) tensor (``keys``/``values``); each
    row's ``keys``/``values`` is a view of its slice, so a row appends in place and nothing is
    re-stacked per step. Full-policy rows (the target) are served straight from it: new tokens
    are written by index and attention reads ``keys[:, :, :longest]`` with per-row masks.
    Budgeted rows gather their own working sets; for single-token steps their
    [selection | window ring] buffers are kept as rows of one batch buffer (``rings``), so a
    step writes one key per row instead of stacking every row's working set."""

    def __init__(self, rows: list[BudgetedLayer], layer_idx: int):
        super().__init__()
        self.rows = rows
        self.layer_idx = layer_idx
        self.counts: list[int] | None = None
        self.feeding: list[int] | None = None  # the rows the next forwards feed, in order (None: every row)
        self.is_initialized = True
        self.rings: tuple[torch.Tensor, torch.Tensor] | None = None
        self._ring_pointers: tuple[Any, list[int]] = (None, [])  # (rings, each row's data pointer in them)
        first = rows[0].keys
        capacity = max(row.keys.shape[2] for row in rows)
        self.keys = first.new_zeros(len(rows), first.shape[1], capacity, first.shape[3])
        self.values = rows[0].values.new_zeros(len(rows), first.shape[1], capacity, rows[0].values.shape[3])
        for index, row in enumerate(rows):
            self.keys[index, :, : row.length] = row.keys[0, :, : row.length]
            self.values[index, :, : row.length] = row.values[0, :, : row.length]
        self._point_rows()

    def _point_rows(self) -> None:
        for index, row in enumerate(self.rows):
            row.keys, row.values = self.keys[index : index + 1], self.values[index : index + 1]
            row.fit_scores(self.keys.shape[2])

    def reserve(self, needed: int) -> None:
        """Grow the shared storage (never a row alone: its view would leave the storage)."""
        if needed > self.keys.shape[2]:
            capacity = grown_capacity(self.keys.shape[2], needed)
            self.keys, self.values = grow_positions(self.keys, capacity), grow_positions(self.values, capacity)
            self._point_rows()

    def keep(self, rows: Sequence[int]) -> None:
        """Keep ``rows`` (in that order); their rings stay rows of ``rings``, so the next step stays batched."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.keys.device)
        rings, in_rings = self.rings, []
        if rings is not None and rings[0].shape[0] == len(self.rows):
            for i in rows:
                ring = self.rows[i].ring_keys()
                in_rings.append(ring is not None and ring.data_ptr() == rings[0][i].data_ptr())
            rings = self.rings = (rings[0].index_select(0, index), rings[1].index_select(0, index))
        else:
            self.rings = None
        self.rows = [self.rows[i] for i in rows]
        self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)
        self._point_rows()
        for new_index, adopted in enumerate(in_rings):  # empty when there were no rings
            if adopted:
                row = self.rows[new_index]
                row.adopt_ring(rings[0][new_index : new_index + 1], rings[1][new_index : new_index + 1])  # type: ignore[index]

    def get_seq_length(self) -> int:
        return max(row.length for row in self.rows)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        """Append the forward's keys and values (batch row j: storage row ``feeding[j]``, or j) and return what
        its attention reads, each batch row its own working set."""
        n_new = key_states.shape[2]
        fed = list(range(len(self.rows))) if self.feeding is None else self.feeding
        rows = [self.rows[index] for index in fed]
        counts = self.counts or [n_new] * len(rows)
        self.reserve(self.get_seq_length() + n_new)
        if len(rows) == 1 and counts[0] == n_new:  # one request: exactly the single-request path
            return rows[0].update(key_states, value_states)
        if all(row.attends_everything(n_new) for row in rows):
            return self._update_full(key_states, value_states, counts, fed)
        if n_new == 1 and all(count == 1 for count in counts):
            slots = self._ring_slots(fed)
            if slots is not None:
                return self._ring_step(key_states, value_states, slots, fed)
        parts: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        notes: list[PendingAttention | None] = []
        for index, (row, count) in enumerate(zip(rows, counts, strict=True)):
            if count == 0:
                parts.append(None)
                notes.append(None)
                continue
            one = slice(index, index + 1)
            parts.append(row.update(key_states[one, :, :count], value_states[one, :, :count]))
            notes.append(pop_pending(self.layer_idx))
        sizes = [0 if part is None else part[0].shape[2] for part in parts]
        width = max(1, max(sizes))
        set_pending(self.layer_idx, BatchPending(self, notes, list(counts), sizes, n_new))
        if self.feeding is None and all(part is not None and size == width and row.ring_keys() is part[0]
               for row, part, size in zip(rows, parts, sizes, strict=True)):  # fmt: skip
            return self._batched_rings(parts)  # type: ignore[arg-type]
        batch, n_kv, _, head_dim = key_states.shape
        if all(size == width for size in sizes):
            keys = torch.cat([part[0] for part in parts], 0)  # type: ignore[index]
            values = torch.cat([part[1] for part in parts], 0)  # type: ignore[index]
        else:
            keys = key_states.new_zeros(batch, n_kv, width, head_dim)
            values = value_states.new_zeros(batch, n_kv, width, value_states.shape[3])
            for index, part in enumerate(parts):
                if part is not None:
                    keys[index, :, : sizes[index]] = part[0][0]
                    values[index, :, : sizes[index]] = part[1][0]
        return keys, values

    def _update_full(self, key_states: torch.Tensor, value_states: torch.Tensor, counts: list[int], fed: list[int]):
        """Every fed row attends to all its stored keys (`BudgetedLayer.attends_everything`): append by index,
        attend over the shared storage."""
        n_new = key_states.shape[2]
        device = self.keys.device
        rows = [self.rows[index] for index in fed]
        lengths = [row.length for row in rows]
        positions = torch.tensor(lengths, device=device)[:, None] + torch.arange(n_new, device=device)[None]
        index = torch.tensor(fed, device=device)
        self.keys[index[:, None], :, positions] = key_states.transpose(1, 2)  # padding lands past a row's length
        self.values[index[:, None], :, positions] = value_states.transpose(1, 2)
        notes: list[PendingAttention | None] = []
        for row, length, count in zip(rows, lengths, counts, strict=True):
            row.length = length + count
            notes.append(PendingAttention(row, length, count, full=True) if count else None)
        sizes = [row.length if count else 0 for row, count in zip(rows, counts, strict=True)]
        width = max(1, max(sizes))
        set_pending(self.layer_idx, BatchPending(self, notes, list(counts), sizes, n_new))
        if self.feeding is None:
            return self.keys[:, :, :width], self.values[:, :, :width]
        return self.keys[:, :, :width].index_select(0, index), self.values[:, :, :width].index_select(0, index)

    def _ring_slots(self, fed: list[int]) -> list[int] | None:
        """Per fed row, the ring slot of a single-token step, when every such row's ring is current in ``rings``;
        a row whose ring is not (a refresh, a restore) is rebuilt in its row of ``rings`` first, so the
        step stays one batched ring step. None where a row cannot take the ring path (then the step goes
        row by row)."""
        rings = self.rings
        if rings is None or rings[0].shape[0] != len(self.rows):
            return None
        if self._ring_pointers[0] is not rings:
            self._ring_pointers = (rings, [rings[0][index].data_ptr() for index in range(len(self.rows))])
        slots = []
        for index in fed:
            row, pointer = self.rows[index], self._ring_pointers[1][index]
            slot = row.ring_step_slot()
            if slot is None or row.ring_keys().data_ptr() != pointer:  # type: ignore[union-attr]
                if not row.rebuild_ring_in(rings[0][index : index + 1], rings[1][index : index + 1]):
                    return None
                slot = row.ring_step_slot()
            slots.append(slot)
        return slots

    def _ring_step(self, key_states: torch.Tensor, value_states: torch.Tensor, slots: list[int], fed: list[int]):
        """A single-token step of budgeted rows with current rings: two index writes for the batch (the fed rows'
        rings are read as a copy when the step feeds some rows only)."""
        device = self.keys.device
        rows = _index_tensor(tuple(fed), device, 0)
        positions = _index_tensor(tuple(self.rows[index].length for index in fed), device, 1)
        ring_slots = _index_tensor(tuple(slots), device, 2)
        keys, values = key_states[:, :, 0], value_states[:, :, 0]
        self.keys[rows, :, positions], self.values[rows, :, positions] = keys, values
        self.rings[0][rows, :, ring_slots], self.rings[1][rows, :, ring_slots] = keys, values  # type: ignore[index]
        notes: list[PendingAttention | None] = [self.rows[index].ring_step_done() for index in fed]  # None: no record
        width = self.rings[0].shape[2]  # type: ignore[index]
        set_pending(self.layer_idx, BatchPending(self, notes, [1] * len(notes), [width] * len(notes), 1, maskless=True))
        if self.feeding is None:
            return self.rings
        return self.rings[0].index_select(0, rows), self.rings[1].index_select(0, rows)  # type: ignore[index]

    def _batched_rings(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Single-token steps: the rows' ring buffers as rows of one batch buffer (a row whose ring
        was rebuilt, after a refresh or a rollback, is copied in; the others are already there)."""
        rings = self.rings
        if rings is None or rings[0].shape[0] != len(parts) or rings[0].shape[2] != parts[0][0].shape[2]:
            rings = self.rings = (torch.cat([part[0] for part in parts], 0), torch.cat([part[1] for part in parts], 0))
            for index, row in enumerate(self.rows):
                row.adopt_ring(rings[0][index : index + 1], rings[1][index : index + 1])
            return rings
        for index, (row, part) in enumerate(zip(self.rows, parts, strict=True)):
            if part[0].data_ptr() != rings[0][index].data_ptr():
                rings[0][index], rings[1][index] = part[0][0], part[1][0]
                row.adopt_ring(rings[0][index : index + 1], rings[1][index : index + 1])
        return rings

    def crop(self, tokens_to_remove: int) -> None:
        for row in self.rows:
            row.crop(tokens_to_remove)


_last_index: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}  # kind -> (values, tensor), shared by the layers


def _index_tensor(values: tuple[int, ...], device: torch.device, kind: int) -> torch.Tensor:
    """``torch.tensor(values)``, reused while consecutive layers of a forward ask for the same values."""
    last = _last_index.get(kind)
    if last is not None and last[0] == values and last[1].device == device:
        return last[1]
    tensor = torch.tensor(values, device=device)
    _last_index[kind] = (values, tensor)
    return tensor


# ---- rows of layers that are not budgeted (recurrent states, plain KV) ----------------------
def _state_slots(layer: Any) -> Iterator[tuple[dict, Any]]:
    """(container, key) of every batch-major tensor a transformers cache layer holds."""
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            yield vars(layer), name
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, torch.Tensor) and item.dim() >= 1:
                    yield value, key


def _join_layers(layers: Sequence[Any]) -> Any:
    joined = copy.deepcopy(layers[0])
    others = [list(_state_slots(layer)) for layer in layers[1:]]
    for slot, (container, key) in enumerate(_state_slots(joined)):
        container[key] = torch.cat([container[key], *[slots[slot][0][slots[slot][1]] for slots in others]], 0)
    return joined


def _select_rows(layer: Any, index: torch.Tensor) -> None:
    for container, key in list(_state_slots(layer)):
        container[key] = container[key].index_select(0, index.to(container[key].device))


class BatchedCache(BudgetedCache):
    """The cache of a batch of requests (draft: budgeted rows; target: full-policy rows)."""

    def __init__(self, model: torch.nn.Module, caches: Sequence[BudgetedCache]):
        if not caches:
            raise CacheError("a batch needs at least one request cache")
        self.__dict__.update(copy.copy(caches[0].__dict__))  # config-derived fields of a DynamicCache
        self.layers = []
        self.budgeted_indices = list(caches[0].budgeted_indices)
        self.window_indices = list(caches[0].window_indices)
        self.row_indices = sorted(self.budgeted_indices + self.window_indices)  # layers with per-row lengths
        if len(caches) > 1 and any(type(layer) is DynamicSlidingWindowLayer for layer in caches[0].layers):
            raise CacheError(
                "a batch of requests at different positions needs per-request sliding windows: "
                "call cache.own_sliding_windows(model) before the prefill"
            )
        for index in range(len(caches[0].layers)):
            if index in self.row_indices:
                self.layers.append(BatchedLayer([cache.layers[index] for cache in caches], index))
            else:
                self.layers.append(_join_layers([cache.layers[index] for cache in caches]))
        self.policy = caches[0].policy

    @classmethod
    def join(cls, model: torch.nn.Module, caches: Sequence[BudgetedCache]) -> BatchedCache:
        """Put prefilled single-request caches (same model) into one batch, in order."""
        return cls(model, caches)

    def add_rows(self, caches: Sequence[BudgetedCache]) -> None:
        """Append prefilled single-request caches as new rows (a request joins a running batch).

        The shared storage is rebuilt once, with the existing rows' KV copied over; the rows keep
        their own state (length, selection, window, query buffer), so a joining request changes
        nothing for the others."""
        for position, layer in enumerate(self.layers):
            joining = [cache.layers[position] for cache in caches]
            if isinstance(layer, BatchedLayer):
                self.layers[position] = BatchedLayer(layer.rows + joining, position)
            else:
                self.layers[position] = _join_layers([layer, *joining])

    @property
    def batch_size(self) -> int:
        return len(self.layers[self.row_indices[0]].rows)

    @property
    def has_recurrent_layers(self) -> bool:
        return any(not isinstance(layer, BatchedLayer) for layer in self.layers)

    def row(self, index: int) -> RowCache:
        return RowCache([self.layers[i].rows[index] for i in self.budgeted_indices])

    def keep_queries(self, keep: bool) -> None:
        """Whether forwards record their queries in the rows (False for draft steps a rollback discards)."""
        for index in self.row_indices:
            for row in self.layers[index].rows:
                row.keeps_queries = keep

    def set_counts(self, counts: list[int] | None) -> None:
        for index in self.row_indices:
            self.layers[index].counts = counts

    @property
    def feeds_some_rows(self) -> bool:
        """Whether a forward can feed some of the rows only (`feed_rows`): every layer keeps per-row state (a
        recurrent state is one batch-major tensor, so a model with such layers feeds every row)."""
        return not self.has_recurrent_layers

    def feed_rows(self, rows: Sequence[int] | None) -> None:
        """The next forwards feed ``rows`` only (batch row j is row ``rows[j]``); the others are left as they are.
        None: every row, in order."""
        if rows is not None and not self.feeds_some_rows:
            raise CacheError("feed_rows: a cache with recurrent layers feeds every row")
        for index in self.row_indices:
            self.layers[index].feeding = None if rows is None else list(rows)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Drop every row not in ``rows`` (finished requests leave the batch)."""
        index = torch.tensor(list(rows), dtype=torch.long)
        for position, layer in enumerate(self.layers):
            if isinstance(layer, BatchedLayer):
                layer.keep(rows)
            else:
                _select_rows(self.layers[position], index)

    def refresh_row(self, index: int) -> None:
        """Rescore request ``index``'s selection only."""
        self.row(index).refresh()

    def refresh(self) -> None:
        for index in range(self.batch_size):
            self.refresh_row(index)

    def snapshot(self) -> list[Any]:
        return [
            [row.snapshot() for row in layer.rows] if isinstance(layer, BatchedLayer) else copy.deepcopy(layer)
            for layer in self.layers
        ]

    def restore(self, states: list[Any]) -> None:
        for index, state in enumerate(states):
            layer = self.layers[index]
            if isinstance(layer, BatchedLayer):
                for row, row_state in zip(layer.rows, state, strict=True):
                    row.restore(row_state)
            else:
                self.layers[index] = copy.deepcopy(state)

    def restore_rows(self, states: list[Any], rows: Sequence[int]) -> None:
        """Roll ``rows`` back to a `snapshot` state (attention layers only: a recurrent state is not per row)."""
        if self.has_recurrent_layers:
            raise CacheError("restore_rows: a cache with recurrent layers is restored whole (restore)")
        for layer, state in zip(self.layers, states, strict=True):
            for index in rows:
                layer.rows[index].restore(state[index])

    def rolls_back_by_crop(self, index: int) -> bool:
        """Whether row ``index`` can drop a round's rejected draft steps by a crop: every layer is
        attention and no selector accumulates attention scores during the steps (H2O), so keeping
        the committed steps' KV and queries leaves the row as a re-feed of its committed tokens would."""
        if self.has_recurrent_layers:
            return False
        return not any(self.layers[layer].rows[index].selector.observes_attention for layer in self.row_indices)

    def keep_logged_queries(self, log: QueryLog, counts: Sequence[int], starts: Sequence[int]) -> None:
        """Record in row i the queries of its first ``counts[i]`` logged single-token forwards (a round's
        committed draft steps, fed at positions ``starts[i]``..), as a forward of those tokens would."""
        for layer_index in self.row_indices:
            rows = self.layers[layer_index].rows
            wanted = [bool(count) and row.wants_queries() for row, count in zip(rows, counts, strict=True)]
            if layer_index not in log.steps or not any(wanted):
                continue
            query, pre_rope_query = log.queries(layer_index, len(rows))
            group_mean = group_query_mean(pre_rope_query, rows[0].keys.shape[1])
            for index, (row, count, start) in enumerate(zip(rows, counts, starts, strict=True)):
                if wanted[index]:
                    note = PendingAttention(row, start, count, full=False)
                    row_slice = slice(index, index + 1)
                    row.record_queries(query[row_slice, :, :count], None, note, group_mean[row_slice, :, :count])

    def recurrent_state(self) -> list[list[torch.Tensor]]:
        """Copies of every non-budgeted layer's batch-major tensors (to put rows back after a forward)."""
        return [
            [container[key].clone() for container, key in _state_slots(layer)]
            for layer in self.layers
            if not isinstance(layer, BatchedLayer)
        ]

    def put_back_rows(self, saved: list[list[torch.Tensor]], rows: torch.Tensor) -> None:
        """Restore ``rows`` (bool, batch) of the non-budgeted layers to ``saved``."""
        others = [layer for layer in self.layers if not isinstance(layer, BatchedLayer)]
        for layer, tensors in zip(others, saved, strict=True):
            for (container, key), old in zip(_state_slots(layer), tensors, strict=True):
                current = container[key]
                if current.shape != old.shape:
                    raise CacheError(f"{type(layer).__name__}.{key}: state changed shape during a grouped forward")
                current[rows.to(current.device)] = old[rows.to(current.device)]

    def query_summary(self) -> list[list[list[float]]] | None:
        raise CacheError("a batched cache has one query summary per request: use cache.row(i).query_summary()")

    def retained_mass(self, n_queries: int = 8) -> float:
        raise CacheError("a batched cache has one retained mass per request: use cache.row(i).retained_mass()")


class RowCache(BudgetedLayers):
    """One request's view of a batched draft cache: what a refresh hook sees."""

    def __init__(self, layers: list[BudgetedLayer]):
        self.budgeted_layers = layers

    def selections(self) -> list[torch.Tensor | None]:
        return [layer.selection for layer in self.budgeted_layers]


# ---- several probe requests' arms in one forward ---------------------------------------------
class StackedArmsLayer(DynamicLayer):
    """One full-attention layer of several probe requests' arms caches, stacked along the batch.

    Each member is one request's `BudgetedLayer` in probe-arms mode (a batch of arms over its own
    stored KV, length and working sets), or its canonical cache's (full attention); a forward splits
    the new keys and values by member, lets each member append them and gather its arms' working sets
    into its rows of one buffer (canonical members: their stored KV, padded and stacked), padded to one
    width. The member's attention note covers its rows (`BatchPending.spans`)."""

    def __init__(self, members: list[BudgetedLayer], layer_idx: int):
        super().__init__()
        self.members = members
        self.layer_idx = layer_idx
        self.spans = [member.keys.shape[0] for member in members]
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return max(member.length for member in self.members)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        """Each member appends its rows' new keys and values; the keys and values attended, (rows, kv, width, d),
        zero past a member's own width (masked). Arms write their working sets into them directly; canonical
        members (full attention) copy in the stored KV their own update returns."""
        n_new = key_states.shape[2]
        notes: list[PendingAttention | None] = []
        if any(member.arms is None for member in self.members):
            parts: list[tuple[torch.Tensor, torch.Tensor]] = []
            for member, rows in zip(self.members, span_slices(self.spans), strict=True):
                parts.append(member.update(key_states[rows], value_states[rows]))
                notes.append(pop_pending(self.layer_idx))
            sizes = [part[0].shape[2] for part in parts]

            def fill(index: int, rows: slice, keys: torch.Tensor, values: torch.Tensor) -> None:
                keys.copy_(parts[index][0])
                values.copy_(parts[index][1])
        else:
            sizes = [member.arm_set_size(n_new) for member in self.members]

            def fill(index: int, rows: slice, keys: torch.Tensor, values: torch.Tensor) -> None:
                self.members[index].update_arms_into(key_states[rows], value_states[rows], keys, values)
                notes.append(pop_pending(self.layer_idx))

        keys, values = self._stacked(key_states, value_states, sizes, fill)
        set_pending(self.layer_idx, BatchPending(self, notes, [n_new] * len(notes), sizes, n_new, list(self.spans)))
        return keys, values

    def _stacked(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        sizes: list[int],
        fill: Callable[[int, slice, torch.Tensor, torch.Tensor], None],
    ):
        """One (rows, kv, max(sizes), d) buffer each for keys and values: `fill(index, rows, keys, values)` writes
        member `index`'s first `sizes[index]` positions into its rows; the rest of its rows are zeroed."""
        width = max(sizes)
        keys = key_states.new_empty(key_states.shape[0], key_states.shape[1], width, key_states.shape[3])
        values = value_states.new_empty(value_states.shape[0], value_states.shape[1], width, value_states.shape[3])
        for index, (rows, size) in enumerate(zip(span_slices(self.spans), sizes, strict=True)):
            fill(index, rows, keys[rows, :, :size], values[rows, :, :size])
            if size < width:
                keys[rows, :, size:] = 0
                values[rows, :, size:] = 0
        return keys, values


class StackedArmsCache(DynamicCache):
    """Several probe requests' arms caches as one cache for one forward (the probe's request batch).

    Budgeted layers become `StackedArmsLayer`s over the members' own layers; the other layers
    (recurrent states) are concatenated for the forward and handed back, row by row, by `split`.
    Every member must feed the same number of new tokens (a recurrent state cannot skip padding).
    Built-in sliding-window layers mask by one position common to the batch, so caches that hold
    them cannot be stacked (`stackable`)."""

    def __init__(self, caches: Sequence[BudgetedCache]):
        if not caches:
            raise CacheError("stacking needs at least one arms cache")
        for cache in caches:
            if not self.stackable(cache):
                raise CacheError("an arms cache with built-in sliding-window layers cannot be stacked")
        self.__dict__.update(copy.copy(caches[0].__dict__))  # config-derived fields of a DynamicCache
        self.members = list(caches)
        self.layers = []
        for index, layer in enumerate(caches[0].layers):
            if isinstance(layer, BudgetedLayer):
                self.layers.append(StackedArmsLayer([cache.layers[index] for cache in caches], index))
            else:
                self.layers.append(_join_layers([cache.layers[index] for cache in caches]))
        self.spans = next(layer.spans for layer in self.layers if isinstance(layer, StackedArmsLayer))

    @staticmethod
    def stackable(cache: DynamicCache) -> bool:
        return not any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers)

    def split(self) -> None:
        """Hand each member its rows of the concatenated (recurrent) layers after a forward."""
        slices = span_slices(self.spans)
        for index, joined in enumerate(self.layers):
            if isinstance(joined, StackedArmsLayer):
                continue
            joined_slots = list(_state_slots(joined))
            for cache, rows in zip(self.members, slices, strict=True):
                member = cache.layers[index]
                for (container, key), (joined_container, joined_key) in zip(
                    _state_slots(member), joined_slots, strict=True
                ):
                    container[key] = joined_container[joined_key][rows]
                for name, value in vars(joined).items():  # flags a forward may set (has_previous_state, ...)
                    if isinstance(value, dict):
                        own = getattr(member, name)
                        own.update({k: v for k, v in value.items() if not isinstance(v, torch.Tensor)})
                    elif not isinstance(value, torch.Tensor):
                        setattr(member, name, copy.copy(value))
