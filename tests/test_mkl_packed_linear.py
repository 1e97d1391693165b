"""float32 Linear layers packed for MKL per row count (`rift_ada.packed_linear`): the same bits as ``F.linear``
where packed, the plain path below `MKL_MIN_ROWS` rows and until a row count recurs, and never a stale copy.
MKL is the float32 kernel off AMD CPUs; these tests choose it on every CPU (tests/test_onednn_float32_linear.py
covers oneDNN's)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tiny_models import ragged_forced_requests, tiny_model

from rift_ada.packed_linear import (
    FLOAT32_PACKING_VARIABLE,
    MKL_MIN_ROWS,
    MKL_PACK_AFTER,
    MKL_ROW_COUNTS,
    PACKING_VARIABLE,
    PackedLinear,
    mkl_packing_available,
    pack_linear_weights,
    passing_row_counts,
)

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not mkl_packing_available(), reason="this torch build has no MKL packed float32 Linear"),
]


@pytest.fixture(autouse=True)
def _mkl_kernel(monkeypatch):
    monkeypatch.setenv(FLOAT32_PACKING_VARIABLE, "mkl")


def _linear(features_in: int = 96, features_out: int = 160, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(features_in, features_out)


def _packed_rows(layer: PackedLinear) -> list[int]:
    return list(layer._rift_packed.packed)


def _packed_at_min_rows() -> tuple[PackedLinear, torch.Tensor]:
    """A layer called `MKL_PACK_AFTER` times at `MKL_MIN_ROWS` rows (so packed for them), and that input."""
    layer = _linear()
    pack_linear_weights(layer)
    x = torch.randn(MKL_MIN_ROWS, 96)
    with torch.no_grad():
        for _ in range(MKL_PACK_AFTER):
            layer(x)
    return layer, x


@pytest.mark.parametrize("shape", [(16, 96), (17, 96), (16, 1, 96), (4, 12, 96), (192, 96), (449, 96)])
def test_a_packed_float32_linear_gives_f_linear_s_bits_once_its_row_count_recurs(shape):
    layer = _linear()
    assert pack_linear_weights(layer) == 1 and type(layer) is PackedLinear
    rows = shape[0] if len(shape) == 2 else shape[0] * shape[1]
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        for call in range(1, MKL_PACK_AFTER + 3):
            assert torch.equal(layer(x), expected), f"call {call}"
            assert _packed_rows(layer) == ([rows] if call >= MKL_PACK_AFTER else [])
        reference = x.double() @ layer.weight.double().T + layer.bias.double()
        torch.testing.assert_close(layer(x).double(), reference, rtol=1e-5, atol=1e-5)


def test_row_counts_below_the_minimum_stay_plain():
    layer = _linear()
    pack_linear_weights(layer)
    with torch.no_grad():
        for rows in range(1, MKL_MIN_ROWS):
            x = torch.randn(rows, 96)
            for _ in range(MKL_PACK_AFTER + 1):
                assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert _packed_rows(layer) == []


def test_the_most_recently_used_row_counts_stay_packed():
    layer = _linear()
    pack_linear_weights(layer)
    counts = [16 + 8 * i for i in range(MKL_ROW_COUNTS + 1)]
    with torch.no_grad():
        for rows in counts:
            for _ in range(MKL_PACK_AFTER):
                layer(torch.randn(rows, 96))
        assert _packed_rows(layer) == counts[1:]  # the first one, least recently used, was dropped
        layer(torch.randn(counts[1], 96))
        assert _packed_rows(layer) == [*counts[2:], counts[1]]


def test_passing_row_counts_read_a_packed_copy_but_neither_count_nor_pack_nor_evict():
    """A round's later draft steps feed ever fewer rows (`passing_row_counts`): those row counts must not evict the
    steady ones' copies, nor earn copies of their own; their products are F.linear's bits either way."""
    layer, x = _packed_at_min_rows()
    with torch.no_grad():
        with passing_row_counts():
            for rows in range(MKL_MIN_ROWS + 1, MKL_MIN_ROWS + 2 * MKL_ROW_COUNTS + 2):
                passing = torch.randn(rows, 96)
                for _ in range(MKL_PACK_AFTER + 1):
                    assert torch.equal(layer(passing), torch.nn.functional.linear(passing, layer.weight, layer.bias))
            assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))  # the packed copy
        assert _packed_rows(layer) == [MKL_MIN_ROWS] and layer._rift_packed.calls == {}


def test_a_rewritten_weight_drops_its_packed_copies_and_training_takes_the_plain_path():
    layer, x = _packed_at_min_rows()
    with torch.no_grad():
        assert _packed_rows(layer) == [MKL_MIN_ROWS]
        layer.weight.mul_(-2)  # an optimizer step: the copy of the old weight must not be read
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        assert _packed_rows(layer) == []
    out = layer(x)  # autograd with a trainable weight
    assert out.grad_fn is not None
    out.sum().backward()
    assert torch.equal(layer.weight.grad, x.sum(0).expand(160, 96))


def test_a_copied_or_pickled_layer_packs_its_own_weight():
    layer, x = _packed_at_min_rows()
    with torch.no_grad():
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert type(other) is PackedLinear and _packed_rows(other) == []
            other.weight.mul_(0.5)
            for _ in range(MKL_PACK_AFTER + 1):
                assert torch.equal(other(x), torch.nn.functional.linear(x, other.weight, other.bias))


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_packed_float32_tiny_model_gives_the_plain_logits_bit_for_bit(architecture):
    plain = tiny_model(architecture, seed=3)
    packed = copy.deepcopy(plain)
    assert pack_linear_weights(packed) > 0
    ids = torch.randint(0, 96, (MKL_MIN_ROWS, 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        for _ in range(MKL_PACK_AFTER + 1):
            assert torch.equal(packed(input_ids=ids).logits, expected)
    assert all(_packed_rows(m) == [MKL_MIN_ROWS] for m in packed.modules() if isinstance(m, PackedLinear))


def test_load_model_packs_a_float32_cpu_model_unless_turned_off(tiny_model_dir, monkeypatch):
    from rift_ada.models import load_model
    from rift_ada.packed_linear import packed_linear_count

    model, _ = load_model(str(tiny_model_dir), dtype="float32")
    assert packed_linear_count(model) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    monkeypatch.setenv(PACKING_VARIABLE, "0")
    model, _ = load_model(str(tiny_model_dir), dtype="float32")
    assert packed_linear_count(model) == 0


def test_a_packed_float32_model_runs_a_closed_loop_batch_exactly_as_the_plain_model():
    """20 ragged teacher-forced and free requests at batches of 16 (continuous) and 20: the packed model's
    tokens, accepted counts, refreshes and draft entropies equal the plain model's, exactly."""
    from rift_ada.speculative import speculative_generate_batch

    plain = tiny_model("llama", seed=9)
    packed = copy.deepcopy(plain)
    pack_linear_weights(packed)

    for max_batch in (16, 20):
        runs = [
            speculative_generate_batch(m, ragged_forced_requests(), draft_length=4, max_batch=max_batch)
            for m in (plain, packed)
        ]
        for index, (want, got) in enumerate(zip(*runs, strict=True)):
            label = f"batch {max_batch} request {index}"
            assert got.tokens == want.tokens, label
            assert [(r.accepted, r.refreshed, r.draft_entropies) for r in got.rounds] == [
                (r.accepted, r.refreshed, r.draft_entropies) for r in want.rounds
            ], label
    packed_rows = {rows for m in packed.modules() if isinstance(m, PackedLinear) for rows in _packed_rows(m)}
    assert packed_rows, "no row count was ever packed: the test ran the plain path only"
