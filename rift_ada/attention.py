"""The attention function that lets a budgeted cache layer hand attention its working set.

A `BudgetedLayer.update` returns the gathered working set and leaves a `PendingAttention` note in
a thread-local slot; the attention function registered here (``rift-sdpa`` / ``rift-eager``)
picks the note up in the same module forward and computes attention with the per-query band
mask. Without a note (a plain cache, e.g. the target in self-speculation, or a layer that is not
budgeted) it delegates to the model's own implementation, so nothing else changes. A batch of
requests (`rift_ada.batch_cache`) leaves a `BatchPending` of its rows' notes instead, attended by
`batched_attention` with per-row masks.

Both attentions live here and import no cache module (the layers reach them through their notes),
so the dependencies run one way: batch_cache -> cache -> attention.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import torch

from rift_ada.packed_linear import cpu_has_amx

if TYPE_CHECKING:
    from transformers.cache_utils import DynamicLayer

    from rift_ada.cache import BudgetedLayer

_slot = threading.local()
_registered: set[str] = set()


@dataclass
class PendingAttention:
    """What the attention call after `update` needs: the layer and how to mask its keys.

    Keys are laid out as [selection (n_selected) | window positions window_start ..]. ``full``
    means plain causal attention over all stored keys (prefill, the full policy, the canonical
    probe pass). ``selection_valid`` (batch, 1|kv, n_selected) masks padded selection slots.
    ``prefix_limit`` (batch,) makes window positions below it visible too (an unfilled selection).
    """

    layer: BudgetedLayer
    first_position: int
    n_new: int
    full: bool
    window: int = 0
    window_start: int = 0
    n_selected: int = 0
    selection_valid: torch.Tensor | None = None
    prefix_limit: torch.Tensor | None = None
    key_positions: torch.Tensor | None = None


def set_pending(layer_idx: int, pending: Any) -> None:
    table = getattr(_slot, "table", None)
    if table is None:
        table = _slot.table = {}
    table[layer_idx] = pending


def pop_pending(layer_idx: int) -> Any:
    table = getattr(_slot, "table", None)
    return None if table is None else table.pop(layer_idx, None)


class QueryLog:
    """The post-RoPE queries of budgeted layers' forwards while it is open (`log_queries`), per layer in
    order: the draft steps of a round, whose committed positions' queries the rows keep once the
    target has verified them (`rift_ada.batch_cache.BatchedCache.keep_logged_queries`)."""

    def __init__(self) -> None:
        self.modules: dict[int, torch.nn.Module] = {}
        self.steps: dict[int, list[tuple[torch.Tensor, Any]]] = {}  # layer -> [(query, (cos, sin))] per forward
        self.step_rows: list[list[int] | None] = []  # per forward, the batch rows it fed (None: every row)

    def feeds(self, rows: list[int] | None) -> None:
        """The next forward feeds only ``rows`` of the batch (None: every row), in that order."""
        self.step_rows.append(rows)

    def add(self, module: torch.nn.Module, layer_idx: int, query: torch.Tensor) -> None:
        self.modules[layer_idx] = module
        self.steps.setdefault(layer_idx, []).append((query, getattr(module, "_rift_position_embeddings", None)))

    def queries(self, layer_idx: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, h, forwards, d) post-RoPE and pre-RoPE queries of ``layer_idx``'s logged single-token forwards. A
        forward that fed some rows only (`feeds`) leaves the other rows' entries zero."""
        spread = [
            step if rows is None else (_of_batch(step[0], rows, batch), _of_batch(step[1], rows, batch))
            for step, rows in zip(self.steps[layer_idx], self.step_rows, strict=True)
        ]
        query = torch.cat([step[0] for step in spread], 2)
        embeddings = None
        if spread[0][1] is not None:
            embeddings = tuple(torch.cat([step[1][part] for step in spread], 1) for part in range(2))
        return query, _inverse_rope(self.modules[layer_idx], query, embeddings)


def _of_batch(tensors: Any, rows: list[int], batch: int) -> Any:
    """A logged forward's tensor of ``rows`` only (a query, or a (cos, sin) pair, or None) as ``batch`` rows, zeros
    elsewhere."""
    if tensors is None or isinstance(tensors, tuple):
        return None if tensors is None else tuple(_of_batch(part, rows, batch) for part in tensors)
    full = tensors.new_zeros((batch, *tensors.shape[1:]))
    full[rows] = tensors
    return full


def log_queries(log: QueryLog | None) -> None:
    """Open ``log`` (None: close the open one) for the forwards that follow, in this thread."""
    _slot.query_log = log


def band_mask(pending: PendingAttention, device: torch.device) -> torch.Tensor:
    """Boolean visibility (batch, 1|kv, q, n_selected + n_window): True = attend."""
    query_positions = torch.arange(pending.first_position, pending.first_position + pending.n_new, device=device)
    end = pending.first_position + pending.n_new
    window_positions = torch.arange(pending.window_start, end, device=device)
    in_band = (window_positions[None, :] <= query_positions[:, None]) & (
        window_positions[None, :] > query_positions[:, None] - pending.window
    )
    batch = 1 if pending.prefix_limit is None else pending.prefix_limit.shape[0]
    window_visible = in_band[None, None].expand(batch, 1, -1, -1)
    if pending.prefix_limit is not None:
        below_prefix = window_positions[None, :] < pending.prefix_limit.to(device)[:, None]  # (batch, n_window)
        causal = window_positions[None, :] <= query_positions[:, None]
        window_visible = window_visible | (below_prefix[:, None, None, :] & causal[None, None])
    if pending.n_selected == 0:
        return window_visible
    if pending.selection_valid is None:
        selected = torch.ones(batch, 1, pending.n_new, pending.n_selected, dtype=torch.bool, device=device)
    else:
        selected = pending.selection_valid[:, :, None, :].expand(-1, -1, pending.n_new, -1)
    heads = max(selected.shape[1], window_visible.shape[1])
    return torch.cat(
        [selected.expand(-1, heads, -1, -1), window_visible.expand(selected.shape[0], heads, -1, -1)], dim=-1
    )


def causal_visibility(first_position: int, n_queries: int, n_keys: int, device: torch.device) -> torch.Tensor:
    """(1, 1, q, n) boolean: queries at ``first_position``.. see every stored key up to their own position."""
    key_positions = torch.arange(n_keys, device=device)
    query_positions = torch.arange(first_position, first_position + n_queries, device=device)
    return (key_positions[None, :] <= query_positions[:, None])[None, None]


def group_query_mean(pre_rope_query: torch.Tensor, n_kv: int) -> torch.Tensor:
    """(b, h, q, d) pre-RoPE queries -> (b, kv, q, d) float mean over each KV group's heads."""
    batch, n_heads, n_queries, _ = pre_rope_query.shape
    return pre_rope_query.float().reshape(batch, n_kv, n_heads // n_kv, n_queries, -1).mean(2)


@dataclass
class BatchPending:
    """The attention note of a batched forward: each row's own note (None: the row is idle)."""

    layer: DynamicLayer
    rows: list[PendingAttention | None]
    counts: list[int]
    sizes: list[int]  # keys of each row in the padded working set
    n_new: int
    spans: list[int] | None = None  # batch rows each note covers (a probe request's arms); None: one each
    maskless: bool = False  # every query sees every key of its row (single-token steps over equal working sets)

    def row_slices(self) -> list[slice]:
        """The batch rows of each note."""
        return span_slices(self.spans or [1] * len(self.rows))


def span_slices(spans: Sequence[int]) -> list[slice]:
    """Consecutive batch rows: ``spans[i]`` rows for member i."""
    ends = list(accumulate(spans))
    return [slice(end - span, end) for end, span in zip(ends, spans, strict=True)]


_last_mask: list[Any] = [None, None]  # (key, mask): the layers of one forward mostly share their rows' masks


def _mask_key(pending: BatchPending, n_kv: int) -> tuple:
    notes = tuple(
        None
        if note is None
        else (
            note.full,
            note.first_position,
            note.window,
            note.window_start,
            note.n_selected,
            _contents(note.prefix_limit),
            _contents(note.selection_valid),
        )
        for note in pending.rows
    )
    spans = None if pending.spans is None else tuple(pending.spans)
    return (notes, tuple(pending.counts), tuple(pending.sizes), pending.n_new, n_kv, spans)


def _contents(tensor: torch.Tensor | None) -> tuple | None:
    """A small mask input's shape and values as a key (a probe's per-arm prefix limits and padded slots: a few
    hundred values, read once per layer)."""
    return None if tensor is None else (tuple(tensor.shape), tuple(tensor.flatten().tolist()))


def batch_mask(pending: BatchPending, n_kv: int, device: torch.device) -> torch.Tensor | None:
    """(b, 1 | kv, q, width) visibility, or None when every query may see every gathered key. The second
    dimension is 1 unless a row's visibility differs between KV heads (per-head selection validity).

    Every layer of a forward usually has the same rows' lengths and windows (and a probe's arms the same padded
    slots), so the last mask is reused when its description matches. Off the CPU, rows with per-slot validity are
    not cached (their key would read the device's values at every layer)."""
    cacheable = all(note is None or note.selection_valid is None or note.selection_valid.device.type == "cpu"
                    for note in pending.rows)  # fmt: skip
    key = _mask_key(pending, n_kv) if cacheable else None
    if cacheable and _last_mask[0] == key and _last_mask[1] is not None and _last_mask[1].device == device:
        return _last_mask[1]
    mask = _batch_mask(pending, n_kv, device)
    if cacheable:
        _last_mask[0], _last_mask[1] = key, mask
    return mask


def _batch_mask(pending: BatchPending, n_kv: int, device: torch.device) -> torch.Tensor | None:
    width = max(1, max(pending.sizes))
    every = all(
        note is not None and count == pending.n_new and size == width and pending.n_new == 1
        for note, count, size in zip(pending.rows, pending.counts, pending.sizes, strict=True)
    )
    if every:  # one new token per row and equal working sets: each token sees all of its own keys
        return None
    slices = pending.row_slices()
    visibles: list[torch.Tensor | None] = []
    for note, count, size in zip(pending.rows, pending.counts, pending.sizes, strict=True):
        if note is None:
            visibles.append(None)
        elif note.full:
            visibles.append(causal_visibility(note.first_position, count, size, device))
        else:
            visibles.append(band_mask(note, device))  # (1 | the note's rows, 1 | kv, q, size)
    heads = max((visible.shape[1] for visible in visibles if visible is not None), default=1)
    mask = torch.zeros(slices[-1].stop, heads, pending.n_new, width, dtype=torch.bool, device=device)
    mask[:, :, :, 0] = True  # padding queries and idle rows see one dummy key; their output is unused
    for rows, visible, count, size in zip(slices, visibles, pending.counts, pending.sizes, strict=True):
        if visible is not None:
            mask[rows, :, :count, :size] = visible.expand(rows.stop - rows.start, heads, -1, -1)
    return mask


_last_additive: list[Any] = [None, None]  # (the boolean mask it was made from, its dtype and group; the mask)


def sdpa_mask(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """`batch_mask`'s (b, 1 | kv, q, n) visibility as SDPA's additive mask: 0 where visible, -inf elsewhere,
    in the queries' dtype, one head for all when the visibility is the same for every KV head (else one per
    query head). SDPA turns a boolean mask into exactly this at every call; made once per forward here (the
    layers share ``mask``), SDPA over a ragged batch's 12-query verification is 1.2-1.3x faster than with the
    boolean mask expanded to every query head, with equal outputs (benchmarks/investigations/verification_mask.py)."""
    key = (mask, group, dtype)
    last = _last_additive[0]
    if last is not None and last[0] is mask and last[1:] == key[1:]:
        return _last_additive[1]
    mask = per_query_head(mask, group)
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    _last_additive[0], _last_additive[1] = key, additive
    return additive


def per_query_head(mask: torch.Tensor, group: int) -> torch.Tensor:
    """A (b, kv, q, n) visibility that differs between KV heads, repeated for each KV head's ``group`` query
    heads (SDPA broadcasts a mask over heads but does not group it); a (b, 1, q, n) one as it is."""
    if mask.shape[1] == 1 or group == 1:
        return mask
    batch, n_kv, n_queries, width = mask.shape
    return mask[:, :, None].expand(-1, -1, group, -1, -1).reshape(batch, n_kv * group, n_queries, width)


def _wants_probs(note: PendingAttention) -> bool:
    """A row whose layer reads this forward's attention probabilities (H2O; a probe's canonical pass)."""
    return note.layer.needs_probs(note) or (note.full and note.layer.wants_full_probs(note))


def batched_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pending: BatchPending,
    scaling: float,
) -> torch.Tensor:
    """Attention of a batch whose rows have their own working sets; returns (b, q, h, d). The pre-RoPE
    queries are computed only when a row records them."""
    batch, n_heads, n_queries, _ = query.shape
    n_kv = key.shape[1]
    group = n_heads // n_kv
    slices = pending.row_slices()
    group_mean = None
    for rows, note, count in zip(slices, pending.rows, pending.counts, strict=True):
        if note is not None and note.layer.wants_queries():
            if group_mean is None:
                group_mean = group_query_mean(_inverse_rope(module, query), n_kv)
            note.layer.record_queries(query[rows, :, :count], None, note, group_mean[rows, :, :count])
    if rows_attend_alone(query) and not pending.maskless:
        return _attention_row_by_row(module, query, key, value, pending, scaling)
    mask = None if pending.maskless else batch_mask(pending, n_kv, key.device)
    visible = None if mask is None else mask[:, :, None]  # (b, 1 | kv, 1, q, n)
    sinks = getattr(module, "sinks", None)
    wants = [note is not None and _wants_probs(note) for note in pending.rows]
    needs_probs = any(wants)
    if sinks is None and not needs_probs:
        if _sdpa_is_slow(query):
            return _single_query_attention(query, key, value, scaling, visible)
        additive = None if mask is None else sdpa_mask(mask, group, query.dtype)
        return _sdpa(query, key, value, additive, scaling)
    probs = _attention_probs(query, key, scaling, visible, sinks)
    for rows, note, count, size, wanted in zip(slices, pending.rows, pending.counts, pending.sizes, wants, strict=True):
        if wanted:
            note.layer.observe_attention(probs[rows, :, :, :count, :size], note)
    return _attention_output(probs, value)


def rows_attend_alone(query: torch.Tensor) -> bool:
    """Whether each request of a batch attends exactly as it would alone: one attention call per note over the
    row's own keys (no padding), the call a request alone makes (`note_attention`). In bfloat16 / float16 the
    kernels' last-bit differences between a padded batch and a row alone flip argmaxes (11-12 of 32 ragged
    requests on SmolLM2 at T = 0, with products of over 32 rows and short rows riding along in verifications;
    docs/notes/2026-12-06-bf16-batch-identity.md), so the low-precision dtypes take it.
    float32 keeps the padded batch: its differences (about 1e-7) have not flipped a token (tests/test_batch.py).
    A single-token step over the batch's rings (``maskless``) is one call either way: SDPA computes each batch
    row on its own. CPU only: on a GPU the products are not row-exact either, and a call per row costs launches."""
    return query.dtype in (torch.bfloat16, torch.float16) and query.device.type == "cpu"


def _attention_row_by_row(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pending: BatchPending,
    scaling: float,
) -> torch.Tensor:
    """`batched_attention` as each note's request computes it alone: (b, q, h, d), padding queries zero."""
    batch, n_heads, n_queries, head_dim = query.shape
    output = query.new_zeros(batch, n_queries, n_heads, head_dim)
    for rows, note, count, size in zip(pending.row_slices(), pending.rows, pending.counts, pending.sizes, strict=True):
        if note is not None and count:
            output[rows, :count] = note_attention(
                module, query[rows, :, :count], key[rows, :, :size], value[rows, :, :size], note, scaling
            )
    return output


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    is_causal: bool = False,
) -> torch.Tensor:
    """torch's SDPA of (b, h, q, d) queries over (b, kv, n, d) keys (grouped when kv < h) -> (b, q, h, d).
    ``is_causal``: a square causal triangle (a prefill), in blocks (`causal_block_starts`) where `causal_blocks_pay`."""
    if is_causal and mask is None and causal_blocks_pay(query, key):
        return _blocked_causal_sdpa(query, key, value, scaling)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=query.shape[1] > key.shape[1]
    )
    return output.transpose(1, 2).contiguous()


CAUSAL_BLOCK = 64  # the fewest queries per SDPA call of a blocked causal prefill
CAUSAL_BLOCKED_UP_TO = 1024  # the longest square prefill that takes blocks


def causal_blocks_pay(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether a square causal prefill of (b, h, n, d) queries runs as `_blocked_causal_sdpa`: on a CPU, for
    2 * `CAUSAL_BLOCK` <= n <= `CAUSAL_BLOCKED_UP_TO`. torch 2.13's CPU flash attention computes a short causal square
    whole; blocks of 64 queries over their keys so far were 1.39x faster at 390 tokens, 1.44x at 512, 1.15x at 1,024
    and 1.00x at 2,048 (float32; bf16 1.37x at 390, 1.09x at 1,024, 0.95x at 2,048; SmolLM2's 9 query heads over 3
    KV heads of 64, one thread, an AMD Zen 4: benchmarks/investigations/causal_blocks.py, 2026-12-07). Other devices
    keep the fused kernel."""
    length = query.shape[2]
    return query.device.type == "cpu" and 2 * CAUSAL_BLOCK <= length <= CAUSAL_BLOCKED_UP_TO and key.shape[2] == length


def causal_block_starts(length: int) -> range:
    """The first query of each block of a blocked causal prefill of ``length`` queries: `CAUSAL_BLOCK` each, the last
    block taking the remainder (64-127 queries). No call has fewer: torch 2.13's CPU SDPA rounds a call of a few
    queries (an odd number under 32) differently at 1 and 2 threads, while calls of 64 or more gave the same bits at
    1-4 threads (docs/notes/2026-12-07-thread-invariant-prefill-blocks.md)."""
    return range(0, max(length // CAUSAL_BLOCK, 1) * CAUSAL_BLOCK, CAUSAL_BLOCK)


def _blocked_causal_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """Causal SDPA of a square prefill, (b, h, n, d) -> (b, n, h, d), one call per block of `causal_block_starts`: the
    first block is its own causal square; each later one sees the keys up to its last query, masked above the
    diagonal. The same attention as one causal call up to the order of float additions (about 3e-7 in float32)."""
    batch, n_heads, length, _ = query.shape
    grouped = n_heads > key.shape[1]
    output = query.new_empty(batch, length, n_heads, value.shape[-1])
    starts = causal_block_starts(length)
    for start, end in zip(starts, [*starts[1:], length], strict=True):
        block = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, :end],
            value[:, :, :end],
            attn_mask=None if start == 0 else causal_visibility(start, end - start, end, query.device),
            is_causal=start == 0,
            scale=scaling,
            enable_gqa=grouped,
        )
        output[:, start:end] = block.transpose(1, 2)
    return output


@functools.cache
def _cpu_has_amx() -> bool:
    """`packed_linear.cpu_has_amx`, asked once (torch's CPU SDPA uses AMX tiles in bf16)."""
    return cpu_has_amx()


def _sdpa_is_slow(query: torch.Tensor) -> bool:
    """One query per row in bf16 / fp16 on a CPU without AMX: there torch's SDPA was 7-8x slower than this module's
    `_single_query_attention` (an AMD Zen 4 with avx512_bf16; at 8-12 queries the two are within 0.85-1.2x, so
    those keep SDPA; benchmarks/investigations/bf16_kernels.py; a decode step over a full cache of 500-2,000 keys
    of SmolLM2's shape: 4-10x, docs/notes/2026-12-07-one-row-kernel.md). With AMX (an Intel Xeon with amx_bf16) SDPA is
    1.25-2.9x faster than `_single_query_attention` on a draft step's ring and a long masked full cache, at about
    a quarter of its mean error (benchmarks/investigations/single_query_attention.py), so it keeps SDPA. Other
    devices keep SDPA (fused kernels)."""
    return (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and query.dtype in (torch.bfloat16, torch.float16)
        and not _cpu_has_amx()
    )


def _single_query_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, visible: torch.Tensor | None
) -> torch.Tensor:
    """`_sdpa_is_slow`'s path, (b, h, q, d) queries over (b, kv, n, d) keys -> (b, q, h, d). bf16: the logits
    GEMM in bf16 (float32 accumulation, rounded once to bf16, as transformers' eager attention) on
    contiguous keys (a slice of the stored KV is strided, which torch's bf16 GEMM reads slowly): 1.3-1.7x
    the float32 upcasts' path on a draft step's ring and on a long full cache, at about 4x its mean error
    (benchmarks/investigations/single_query_attention.py); fp16 upcasts (its range). Then a float32
    softmax and the values GEMM in their dtype. ``visible``: (b, kv, 1, q, n)."""
    if query.dtype != torch.bfloat16:
        return _attention_output(_attention_probs(query, key, scaling, visible, None), value)
    batch, n_heads, n_queries, head_dim = query.shape
    n_kv, n_keys = key.shape[1], key.shape[2]
    grouped = query.reshape(batch, n_kv, n_heads // n_kv * n_queries, head_dim)
    logits = torch.matmul(grouped, key.contiguous().transpose(-1, -2)).float().mul_(scaling)
    logits = logits.view(batch, n_kv, n_heads // n_kv, n_queries, n_keys)
    if visible is not None:
        logits = logits.masked_fill_(~visible, float("-inf"))
    return _attention_output(torch.softmax(logits, dim=-1), value)


def _attention_probs(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    visible: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Float32 softmax probabilities (b, kv, group, q, n) of (b, h, q, d) queries over (b, kv, n, d) keys.

    ``visible`` (bool, broadcast to that shape) masks keys; ``sinks`` (h,) adds gpt-oss's per-head sink
    logit to the softmax. The logits are computed on float32 upcasts whatever the inputs' dtype."""
    batch, n_heads, n_queries, head_dim = query.shape
    n_kv = key.shape[1]
    grouped = query.reshape(batch, n_kv, n_heads // n_kv, n_queries, head_dim)
    logits = torch.einsum("bkgqd,bknd->bkgqn", grouped.float(), key.float()) * scaling
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    sink = sinks.float().reshape(1, n_kv, -1, 1, 1).expand(batch, -1, -1, n_queries, 1)
    return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]


def _attention_output(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """(b, kv, group, q, n) probabilities times (b, kv, n, d) values, in the values' dtype -> (b, q, h, d)."""
    batch, n_kv, group, n_queries, _ = probs.shape
    output = torch.einsum("bkgqn,bknd->bkgqd", probs.to(value.dtype), value)
    return output.reshape(batch, n_kv * group, n_queries, -1).transpose(1, 2).contiguous()


def _inverse_rope(module: torch.nn.Module, query: torch.Tensor, position_embeddings: Any = None) -> torch.Tensor:
    """Undo the module's rotary embedding (rotation by -theta) to recover pre-RoPE queries.
    ``position_embeddings``: the (cos, sin) the queries were rotated with (default: the module's last)."""
    if position_embeddings is None:
        position_embeddings = getattr(module, "_rift_position_embeddings", None)
    if position_embeddings is None:
        return query
    cos, sin = position_embeddings
    rotate = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    if rotate is None:
        return query
    unrotated, _ = rotate(query, query, cos, -sin)
    return unrotated


def budgeted_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pending: PendingAttention,
    scaling: float,
) -> torch.Tensor:
    """Masked attention over the working set, the queries recorded first where the layer keeps them; returns
    (b, q, h, d)."""
    layer = pending.layer
    if layer.wants_queries():
        layer.record_queries(query, _inverse_rope(module, query), pending)
    return note_attention(module, query, key, value, pending, scaling)


def note_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pending: PendingAttention,
    scaling: float,
) -> torch.Tensor:
    """One request's attention as its note describes it (the queries already recorded); returns (b, q, h, d).
    Full rows without probabilities to observe take SDPA with the causal band (`rows_attend_alone` dtypes: alone
    and in a batch alike; float32 requests alone take the model's own attention function instead), or, for one
    query where `_sdpa_is_slow`, `_single_query_attention`, as the budgeted rows do."""
    layer = pending.layer
    n_queries = query.shape[2]
    group = query.shape[1] // key.shape[1]
    sinks = getattr(module, "sinks", None)
    if not pending.full and sinks is None and not layer.needs_probs(pending):
        # Fast path: fused attention. A single query sees every gathered key (its own window and the
        # selection), so it needs no mask, unless selection slots are padding (a probe arm's).
        masked = n_queries > 1 or pending.selection_valid is not None
        visibility = band_mask(pending, key.device) if masked else None
        if _sdpa_is_slow(query):
            return _single_query_attention(
                query, key, value, scaling, None if visibility is None else visibility[:, :, None]
            )
        return _sdpa(query, key, value, None if visibility is None else per_query_head(visibility, group), scaling)
    if pending.full and sinks is None and not _wants_probs(pending):
        n_keys = key.shape[2]
        square = pending.first_position == 0 and n_queries == n_keys  # a prefill: the causal triangle
        every_key = n_queries == 1 and pending.first_position + 1 == n_keys  # a decode step sees all it stored
        masked = not (square or every_key)
        mask = causal_visibility(pending.first_position, n_queries, n_keys, key.device) if masked else None
        if _sdpa_is_slow(query):  # a decode step over the full cache (target generation, a full-KV draft)
            return _single_query_attention(query, key, value, scaling, None if mask is None else mask[:, :, None])
        return _sdpa(query, key, value, mask, scaling, is_causal=square and n_queries > 1)
    if pending.full:
        visible = causal_visibility(pending.first_position, n_queries, key.shape[2], key.device)[:, :, None]
    else:
        visible = band_mask(pending, key.device)[:, :, None]  # (b, 1|kv, 1, q, L)
    probs = _attention_probs(query, key, scaling, visible, sinks)
    layer.observe_attention(probs, pending)
    return _attention_output(probs, value)


def _base_function(module: torch.nn.Module, base: str) -> Callable[..., Any]:
    if base == "eager":
        own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if own is not None:
            return own
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[base]


def _make_interface(base: str) -> Callable[..., Any]:
    def rift_attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        pending = pop_pending(getattr(module, "layer_idx", -1))
        log = getattr(_slot, "query_log", None)
        if log is not None and pending is not None:
            log.add(module, module.layer_idx, query)
        if pending is not None and not isinstance(pending, PendingAttention):  # a batch of requests
            scaling = kwargs.get("scaling") or module.scaling
            output = batched_attention(module, query, key, value, pending, scaling)
            return output, None
        if pending is None or (
            pending.full and not pending.layer.wants_full_probs(pending) and not rows_attend_alone(query)
        ):
            if pending is not None and pending.layer.wants_queries():
                pending.layer.record_queries(query, _inverse_rope(module, query), pending)
            if base == "sdpa" and _plain_causal_square(module, query, key, attention_mask, kwargs):
                return _sdpa(query, key, value, None, kwargs.get("scaling") or module.scaling, is_causal=True), None
            return _base_function(module, base)(module, query, key, value, attention_mask, *args, **kwargs)
        scaling = kwargs.get("scaling") or module.scaling
        return budgeted_attention(module, query, key, value, pending, scaling), None

    return rift_attention


def _plain_causal_square(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, attention_mask: Any, kwargs: dict[str, Any]
) -> bool:
    """A call transformers' SDPA attention would make as one causal SDPA of a square prefill (no mask, no sliding
    window, soft-capping, position bias or dropout), which `_sdpa` runs in blocks where `causal_blocks_pay`."""
    return (
        attention_mask is None
        and kwargs.get("is_causal", getattr(module, "is_causal", True)) is not False
        and not module.training
        and not kwargs.get("dropout")
        and all(kwargs.get(name) is None for name in ("sliding_window", "softcap", "position_bias", "s_aux"))
        and causal_blocks_pay(query, key)
    )


def register_attention(base: str) -> str:
    """Register ``rift-<base>`` with transformers' attention and mask interfaces; return its name."""
    name = f"rift-{base}"
    if name in _registered:
        return name
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    mask_function = AttentionMaskInterface._global_mapping.get(base) or AttentionMaskInterface._global_mapping["sdpa"]
    AttentionInterface.register(name, _make_interface(base))
    AttentionMaskInterface.register(name, mask_function)
    _registered.add(name)
    return name


def _capture_position_embeddings(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    module._rift_position_embeddings = kwargs.get("position_embeddings")


def install(model: torch.nn.Module) -> None:
    """Route the model's attention through ``rift-<base>`` and capture RoPE tables. Idempotent."""
    config = model.config
    current = config._attn_implementation or "sdpa"
    if current.startswith("rift-"):
        return
    base = current if current in ("sdpa", "eager") else "sdpa"
    name = register_attention(base)
    model.set_attn_implementation(name)
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "scaling") and not getattr(module, "_rift_hooked", False):
            module.register_forward_pre_hook(_capture_position_embeddings, with_kwargs=True)
            module._rift_hooked = True
