"""Budgeted and batched attention in reduced precision (bf16 / fp16 single-query steps take
`_single_query_attention` instead of torch's SDPA on a CPU without AMX, several queries keep SDPA): against a
float64 dense-mask attention. Both single-query paths are tested on every CPU (``single_query_path``)."""

from __future__ import annotations

import math

import pytest
import torch

import rift_ada.attention as attention
from rift_ada.attention import BatchPending, PendingAttention, batched_attention, budgeted_attention

N_HEADS, N_KV, HEAD_DIM = 6, 2, 16
SCALING = HEAD_DIM**-0.5
# a float32 softmax; bf16's single-query logits, the probabilities and the output are rounded to the dtype
# (2^-8 relative for bf16, 2^-11 for fp16), so a few of its units in the last place on outputs of magnitude ~1
TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}


@pytest.fixture(params=["own single-query path", "sdpa"])
def single_query_path(request, monkeypatch):
    """Which path a bf16 / fp16 single query takes, whatever this CPU would choose (`attention._cpu_has_amx`)."""
    monkeypatch.setattr(attention, "_cpu_has_amx", lambda: request.param == "sdpa")
    taken = []
    own = attention._single_query_attention
    monkeypatch.setattr(attention, "_single_query_attention", lambda *a: taken.append(1) or own(*a))
    yield request.param, taken


class _Layer:
    """The part of a budgeted layer attention consults: no queries recorded, no probabilities read."""

    def wants_queries(self) -> bool:
        return False

    def needs_probs(self, note: PendingAttention) -> bool:
        return False

    def wants_full_probs(self, note: PendingAttention) -> bool:
        return False


def _note(first_position: int, n_new: int, window: int, n_selected: int) -> PendingAttention:
    """Keys laid out as [n_selected selected | window positions from first_position - window + 1]."""
    start = max(0, first_position - window + 1)
    return PendingAttention(_Layer(), first_position, n_new, False, window, start, n_selected)


def _visible(note: PendingAttention, width: int) -> torch.Tensor:
    """(q, width) visibility written out by hand: every selected key; window key k iff q - window < k <= q."""
    visible = torch.zeros(note.n_new, width, dtype=torch.bool)
    for query in range(note.n_new):
        position = note.first_position + query
        visible[query, : note.n_selected] = True
        for slot in range(width - note.n_selected):
            key_position = note.window_start + slot
            visible[query, note.n_selected + slot] = position - note.window < key_position <= position
    return visible


def _dense(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """float64 softmax(q k^T * scale + mask) v of one row, each query head on its KV group's head: (q, h, d)."""
    query, key, value = (t.double() for t in (query, key, value))
    group = N_HEADS // N_KV
    out = torch.empty(query.shape[1], N_HEADS, HEAD_DIM, dtype=torch.float64)
    for head in range(N_HEADS):
        logits = query[head] @ key[head // group].T * SCALING
        logits = logits.masked_fill(~visible, -math.inf)
        out[:, head] = torch.softmax(logits, -1) @ value[head // group]
    return out


def _tensors(batch: int, n_queries: int, width: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, N_HEADS, n_queries, HEAD_DIM, generator=generator) * 1.5
    key = torch.randn(batch, N_KV, width, HEAD_DIM, generator=generator) * 1.5
    value = torch.randn(batch, N_KV, width, HEAD_DIM, generator=generator)
    return query.to(dtype), key.to(dtype), value.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_queries", [1, 12])
def test_reduced_precision_budgeted_attention_matches_dense_reference(dtype, n_queries, single_query_path):
    note = _note(first_position=40, n_new=n_queries, window=24, n_selected=10)
    width = note.n_selected + (note.first_position + n_queries - note.window_start)
    query, key, value = _tensors(3, n_queries, width, dtype, seed=n_queries)
    got = budgeted_attention(torch.nn.Module(), query, key, value, note, SCALING)
    assert got.dtype == dtype and got.shape == (3, n_queries, N_HEADS, HEAD_DIM)
    path, taken = single_query_path
    assert bool(taken) == (n_queries == 1 and path != "sdpa")
    visible = _visible(note, width)
    for row in range(3):
        reference = _dense(query[row], key[row], value[row], visible)
        torch.testing.assert_close(got[row].double(), reference, atol=TOLERANCE[dtype], rtol=0)
    # the float32 path (torch's SDPA) on the same values is exact to float32 rounding
    exact = budgeted_attention(torch.nn.Module(), query.float(), key.float(), value.float(), note, SCALING)
    for row in range(3):
        torch.testing.assert_close(
            exact[row].double(), _dense(query[row], key[row], value[row], visible), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_new", [1, 4])
def test_reduced_precision_batched_attention_matches_each_row_alone(dtype, n_new, single_query_path):
    # ragged working sets: each row must ignore the padded keys past its own
    notes = [_note(30, n_new, 16, 8), _note(52, min(2, n_new), 16, 0), _note(21, n_new, 12, 5)]
    counts = [note.n_new for note in notes]
    sizes = [note.n_selected + (note.first_position + note.n_new - note.window_start) for note in notes]
    width = max(sizes)
    pending = BatchPending(_Layer(), notes, counts, sizes, n_new=n_new)
    query, key, value = _tensors(3, n_new, width, dtype, seed=7)
    got = batched_attention(torch.nn.Module(), query, key, value, pending, SCALING)
    assert got.dtype == dtype
    path, taken = single_query_path
    assert bool(taken) == (n_new == 1 and path != "sdpa")
    for row, (note, count, size) in enumerate(zip(notes, counts, sizes, strict=True)):
        reference = _dense(query[row, :, :count], key[row, :, :size], value[row, :, :size], _visible(note, size))
        torch.testing.assert_close(got[row, :count].double(), reference, atol=TOLERANCE[dtype], rtol=0)
        rows = slice(row, row + 1)  # bit for bit the row alone: the padded batch flips bf16 argmaxes
        alone = budgeted_attention(
            torch.nn.Module(), query[rows, :, :count], key[rows, :, :size], value[rows, :, :size], note, SCALING
        )
        assert torch.equal(got[rows, :count], alone), f"row {row}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_full_rows_of_a_batch_attend_as_each_row_alone(dtype):
    """A target's verification: ragged rows of full attention (12, 9 and 5 new queries over 70, 41 and 93
    stored keys), each bit for bit what the row alone computes, and within the dtype's rounding of a dense
    causal reference; a prefill (queries from position 0) takes the causal path."""
    firsts, counts = [58, 32, 88], [12, 9, 5]
    notes = [PendingAttention(_Layer(), first, count, True) for first, count in zip(firsts, counts, strict=True)]
    sizes = [first + count for first, count in zip(firsts, counts, strict=True)]
    pending = BatchPending(_Layer(), notes, counts, sizes, n_new=max(counts))
    query, key, value = _tensors(3, max(counts), max(sizes), dtype, seed=13)
    got = batched_attention(torch.nn.Module(), query, key, value, pending, SCALING)
    for row, (note, count, size) in enumerate(zip(notes, counts, sizes, strict=True)):
        rows = slice(row, row + 1)
        alone = budgeted_attention(
            torch.nn.Module(), query[rows, :, :count], key[rows, :, :size], value[rows, :, :size], note, SCALING
        )
        assert torch.equal(got[rows, :count], alone), f"row {row}"
        causal = torch.arange(size)[None, :] <= torch.arange(note.first_position, size)[:, None]
        reference = _dense(query[row, :, :count], key[row, :, :size], value[row, :, :size], causal)
        torch.testing.assert_close(got[row, :count].double(), reference, atol=TOLERANCE[dtype], rtol=0)
    q, k, v = query[:1, :, :12], key[:1, :, :12], value[:1, :, :12]
    got = budgeted_attention(torch.nn.Module(), q, k, v, PendingAttention(_Layer(), 0, 12, True), SCALING)
    causal = torch.arange(12)[None, :] <= torch.arange(12)[:, None]
    torch.testing.assert_close(got[0].double(), _dense(q[0], k[0], v[0], causal), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_full_decode_step_takes_the_single_query_path_where_sdpa_is_slow(dtype, single_query_path):
    """Target generation's decode step: one query over every stored key, and one that sees only the first 41 of
    64 stored keys; then a batch of three such rows over ragged caches, each row bit for bit the row alone.
    Within the dtype's rounding of a dense causal reference on either path."""
    path, taken = single_query_path
    for first, size in ((63, 64), (40, 64)):
        query, key, value = _tensors(2, 1, size, dtype, seed=first)
        got = budgeted_attention(
            torch.nn.Module(), query, key, value, PendingAttention(_Layer(), first, 1, True), SCALING
        )
        visible = torch.arange(size)[None, :] <= first
        for row in range(2):
            reference = _dense(query[row], key[row], value[row], visible)
            torch.testing.assert_close(got[row].double(), reference, atol=TOLERANCE[dtype], rtol=0)
    assert len(taken) == (0 if path == "sdpa" else 2)
    sizes = [70, 41, 93]
    notes = [PendingAttention(_Layer(), size - 1, 1, True) for size in sizes]
    pending = BatchPending(_Layer(), notes, [1, 1, 1], sizes, n_new=1)
    query, key, value = _tensors(3, 1, max(sizes), dtype, seed=17)
    got = batched_attention(torch.nn.Module(), query, key, value, pending, SCALING)
    for row, (note, size) in enumerate(zip(notes, sizes, strict=True)):
        rows = slice(row, row + 1)
        alone = budgeted_attention(
            torch.nn.Module(), query[rows], key[rows, :, :size], value[rows, :, :size], note, SCALING
        )
        assert torch.equal(got[rows], alone), f"row {row}"
        reference = _dense(query[row], key[row, :, :size], value[row, :, :size], torch.ones(1, size, dtype=torch.bool))
        torch.testing.assert_close(got[row].double(), reference, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_head_validity", [False, True])
def test_sdpa_mask_gives_sdpa_the_boolean_masks_result_bit_for_bit(dtype, per_head_validity):
    # a verification-like forward: 4 queries per row over ragged working sets; with per_head_validity, row 0's
    # selection has padded slots that differ between KV heads (a probe's per-head selections)
    notes = [_note(30, 4, 16, 8), _note(52, 2, 16, 0), _note(21, 4, 12, 5)]
    valid = torch.ones(1, N_KV, 8, dtype=torch.bool)
    valid[0, 1, 5:] = False
    if per_head_validity:
        notes[0].selection_valid = valid
    counts = [note.n_new for note in notes]
    sizes = [note.n_selected + (note.first_position + note.n_new - note.window_start) for note in notes]
    width = max(sizes)
    pending = BatchPending(_Layer(), notes, counts, sizes, n_new=4)
    mask = attention.batch_mask(pending, N_KV, torch.device("cpu"))
    assert mask.shape == (3, N_KV if per_head_validity else 1, 4, width)
    group = N_HEADS // N_KV
    additive = attention.sdpa_mask(mask, group, dtype)
    assert additive.dtype == dtype
    assert attention.sdpa_mask(mask, group, dtype) is additive  # made once for the layers of a forward
    every_head = mask[:, :, None].expand(-1, N_KV, group, -1, -1).reshape(3, N_HEADS, 4, width)  # as main did
    assert torch.equal(additive == 0, every_head if per_head_validity else mask)
    assert bool((additive[~(additive == 0)] == -math.inf).all())
    query, key, value = _tensors(3, 4, width, dtype, seed=11)

    def sdpa(attn_mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, scale=SCALING, enable_gqa=True
        )

    assert torch.equal(sdpa(additive), sdpa(every_head))
    got = batched_attention(torch.nn.Module(), query, key, value, pending, SCALING)
    if dtype == torch.float32:  # one padded SDPA call; bf16 rows attend one by one (the tests below)
        assert torch.equal(got, sdpa(additive).transpose(1, 2))
    for row, (note, count, size) in enumerate(zip(notes, counts, sizes, strict=True)):  # against a dense reference
        for head in range(N_HEADS):
            visible = _visible(note, size)
            if note.selection_valid is not None:
                visible[:, : note.n_selected] &= note.selection_valid[0, head // group]
            q, k, v = (t.double() for t in (query[row, head, :count], key[row, head // group, :size],
                                            value[row, head // group, :size]))  # fmt: skip
            reference = torch.softmax((q @ k.T * SCALING).masked_fill(~visible, -math.inf), -1) @ v
            tolerance = 1e-5 if dtype == torch.float32 else TOLERANCE[dtype]
            torch.testing.assert_close(got[row, :count, head].double(), reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [127, 128, 200, 971])
def test_a_square_causal_prefill_matches_dense_reference_in_blocks_where_they_pay(dtype, length, monkeypatch):
    # a prefill as transformers' SDPA attention receives it (no mask, square): blocks of 64-127 queries from 128
    blocked = []
    own = attention._blocked_causal_sdpa
    monkeypatch.setattr(attention, "_blocked_causal_sdpa", lambda *a: blocked.append(1) or own(*a))
    module = torch.nn.Module().eval()
    module.layer_idx, module.scaling, module.is_causal = 0, SCALING, True
    module.num_key_value_groups = N_HEADS // N_KV
    query, key, value = _tensors(2, length, length, dtype, seed=length)
    got, _ = attention._make_interface("sdpa")(module, query, key, value, None)
    assert got.shape == (2, length, N_HEADS, HEAD_DIM)
    assert len(blocked) == (length >= 2 * attention.CAUSAL_BLOCK)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    tolerance = 1e-5 if dtype == torch.float32 else TOLERANCE[dtype]
    for row in range(2):
        reference = _dense(query[row], key[row], value[row], causal)
        torch.testing.assert_close(got[row].double(), reference, atol=tolerance, rtol=0)
    masked, _ = attention._make_interface("sdpa")(module, query, key, value, causal[None, None])
    assert len(blocked) == (length >= 2 * attention.CAUSAL_BLOCK)  # a mask given: transformers' own attention
    torch.testing.assert_close(masked.double(), got.double(), atol=2 * tolerance, rtol=0)


@pytest.mark.parametrize("length", [128, 191, 971, 1024])
def test_causal_blocks_hold_at_least_one_block_of_queries_each(length):
    starts = list(attention.causal_block_starts(length))
    sizes = [end - start for start, end in zip(starts, [*starts[1:], length], strict=True)]
    assert starts[0] == 0 and sum(sizes) == length
    assert all(attention.CAUSAL_BLOCK <= size < 2 * attention.CAUSAL_BLOCK for size in sizes)
    assert sizes[:-1] == [attention.CAUSAL_BLOCK] * (len(sizes) - 1)


@pytest.mark.parametrize(("n_heads", "n_kv", "head_dim"), [(4, 2, 8), (9, 3, 64)])  # the tiny llama's, SmolLM2's
def test_a_blocked_causal_prefill_gives_the_same_bits_at_one_and_two_threads(n_heads, n_kv, head_dim):
    # a run resumed (or a shard run) at another thread count must agree with the whole run: torch's CPU SDPA rounds
    # an 11-query call over 971 keys differently at 1 and 2 threads, so the last block takes the remainder instead
    threads = torch.get_num_threads()
    generator = torch.Generator().manual_seed(0)
    try:
        for length in (128, 203, 390, 971):
            query = torch.randn(1, n_heads, length, head_dim, generator=generator)
            key, value = (torch.randn(1, n_kv, length, head_dim, generator=generator) for _ in range(2))
            outputs = []
            for count in (1, 2):
                torch.set_num_threads(count)
                outputs.append(attention._blocked_causal_sdpa(query, key, value, head_dim**-0.5))
            assert torch.equal(*outputs), length
    finally:
        torch.set_num_threads(threads)


def test_batch_mask_is_reused_only_for_the_same_padded_slots_and_prefix_limits():
    # a probe's arms rows (two arms per note): each layer builds its own tensors of the same contents
    def pending(valid_size: int, prefix_limits: list[int]) -> BatchPending:
        notes = []
        for first in (30, 41):
            note = _note(first, 4, 16, 8)
            note.selection_valid = (torch.arange(8) < torch.tensor([8, valid_size])[:, None])[:, None, :]
            note.prefix_limit = torch.tensor(prefix_limits)
            notes.append(note)
        sizes = [note.n_selected + (note.first_position + note.n_new - note.window_start) for note in notes]
        return BatchPending(_Layer(), notes, [4, 4], sizes, n_new=4, spans=[2, 2])

    device = torch.device("cpu")
    first = attention.batch_mask(pending(5, [0, 0]), N_KV, device)
    assert attention.batch_mask(pending(5, [0, 0]), N_KV, device) is first  # equal contents: the same mask
    for changed in (pending(6, [0, 0]), pending(5, [0, 20])):  # another arm's padding or prefix: a new mask
        mask = attention.batch_mask(changed, N_KV, device)
        assert mask is not first
        assert torch.equal(mask, attention._batch_mask(changed, N_KV, device))
        assert not torch.equal(mask, first)
