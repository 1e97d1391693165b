"""bfloat16 Linear layers packed for oneDNN (`rift_ada.packed_linear`): same products, each row's bits the same at
every row count, and the plain path wherever the packed copy would be wrong (autograd, a rewritten weight, another
dtype)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tiny_models import tiny_model

from rift_ada import packed_linear
from rift_ada.packed_linear import (
    PACKING_VARIABLE,
    PackedLinear,
    bfloat16_rows_exact,
    pack_linear_weights,
    packing_available,
    rows_as_alone,
)

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN bfloat16 (nothing to pack)"),
]


def _linear(rows_in: int = 96, rows_out: int = 160, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(rows_in, rows_out).to(torch.bfloat16)


def _reference(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The product computed from scratch in float64."""
    return x.double() @ layer.weight.double().T + layer.bias.double()


@pytest.mark.parametrize("rows", [1, 12, 32, 448])
def test_a_packed_linear_is_the_product_rounded_once_and_each_row_its_own(rows):
    layer = _linear()
    plain = copy.deepcopy(layer)
    assert pack_linear_weights(layer) == 1 and type(layer) is PackedLinear
    x = torch.randn(rows, 96).to(torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
        reference = _reference(layer, x)
        # float32 accumulation rounded to bfloat16 once: within half a bf16 ulp (2^-9 relative) plus accumulation
        torch.testing.assert_close(got.double(), reference, rtol=2**-8, atol=1e-2)
        torch.testing.assert_close(got, plain(x), rtol=2**-8, atol=1e-2)
        assert torch.equal(layer(x[-1:])[0], got[-1]), "a row's product depends on the other rows"


def test_training_a_packed_linear_takes_the_plain_path_and_the_new_weight_is_packed_again():
    layer = _linear()
    plain = copy.deepcopy(layer)
    pack_linear_weights(layer)
    x = torch.randn(5, 96).to(torch.bfloat16)
    layer(x).float().sum().backward()
    plain(x).float().sum().backward()
    assert torch.equal(layer.weight.grad, plain.weight.grad)
    with torch.no_grad():
        layer.weight.mul_(-2)  # an optimizer step: the packed copy of the old weight must not be read
        plain.weight.mul_(-2)
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        torch.testing.assert_close(layer(x), plain(x), rtol=2**-8, atol=1e-2)


def test_a_copied_or_pickled_model_packs_its_own_weights():
    layer = _linear()
    pack_linear_weights(layer)
    x = torch.randn(3, 96).to(torch.bfloat16)
    with torch.no_grad():
        expected = layer(x)
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert type(other) is PackedLinear and list(other.state_dict()) == ["weight", "bias"]
            other.weight.mul_(0.5)  # its own weight, not the original's packed copy
            torch.testing.assert_close(other(x), 0.5 * (expected - layer.bias) + layer.bias, rtol=2**-7, atol=2e-2)


def test_float16_linears_are_not_packed_and_other_inputs_take_the_plain_path():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8).half(), torch.nn.Linear(8, 8).to(torch.bfloat16))
    assert pack_linear_weights(model) == 1
    assert type(model[0]) is torch.nn.Linear and type(model[1]) is PackedLinear
    assert pack_linear_weights(model) == 0  # idempotent
    x = torch.randn(2, 8)
    with torch.no_grad():
        model[1].float()  # now a float32 layer: the packed bfloat16 copy must not be read
        assert torch.equal(model[1](x), torch.nn.functional.linear(x, model[1].weight, model[1].bias))


def test_a_packed_tiny_model_decodes_as_the_plain_one():
    """Logits of a batch of 4 prompts, packed against plain, on a tiny llama in bfloat16."""
    plain = tiny_model("llama", seed=3).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    assert pack_linear_weights(packed) > 0
    ids = torch.randint(0, 96, (4, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for model in (plain, packed):
            model.logits = model(input_ids=ids).logits.float()
    torch.testing.assert_close(packed.logits, plain.logits, rtol=0.05, atol=0.05)
    agree = (packed.logits.argmax(-1) == plain.logits.argmax(-1)).float().mean().item()
    assert agree > 0.95


def test_load_model_packs_a_bfloat16_cpu_model_unless_turned_off(tiny_model_dir, monkeypatch):
    from rift_ada.models import load_model
    from rift_ada.packed_linear import packed_linear_count

    model, _ = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert packed_linear_count(model) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    model, _ = load_model(str(tiny_model_dir), dtype="float16")
    assert packed_linear_count(model) == 0
    monkeypatch.setenv(PACKING_VARIABLE, "0")
    model, _ = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert packed_linear_count(model) == 0


def test_a_compiled_packed_linear_traces_the_plain_product():
    """torch.compile cannot trace oneDNN's packed tensor: under compilation the layer is a plain F.linear."""
    layer = _linear()
    pack_linear_weights(layer)
    x = torch.randn(4, 96).to(torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(layer, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), layer(x), rtol=2**-8, atol=1e-2)


@pytest.mark.skipif(not bfloat16_rows_exact(), reason="this CPU's packed bf16 rows are not exact")
@pytest.mark.parametrize(("fan_in", "fan_out"), [(576, 1536), (1536, 576), (640, 2048)])
def test_inside_rows_as_alone_each_row_of_a_long_product_has_its_bits_alone(fan_in, fan_out):
    """SmolLM2's MLP and Gemma3's shapes: a product of more than `ROWS_HINT` rows (a batch's verification) runs
    in pieces inside `rows_as_alone`, each row what the row alone gives; the product itself is unchanged."""
    layer = _linear(fan_in, fan_out, seed=1)
    pack_linear_weights(layer)
    x = torch.randn(384, fan_in, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        alone = torch.cat([layer(x[row : row + 1]) for row in range(x.shape[0])])
        for rows in (33, 100, 384):
            with rows_as_alone():
                got = layer(x[:rows].reshape(1, rows, fan_in))
            assert got.shape == (1, rows, fan_out)
            assert torch.equal(got[0], alone[:rows]), f"{rows} rows"
        torch.testing.assert_close(got[0].double(), _reference(layer, x), rtol=2**-8, atol=2e-2)


@pytest.mark.parametrize(("fan_in", "fan_out"), [(1536, 576), (2048, 640), (576, 49152)])
def test_every_row_count_gives_each_row_its_bits_in_a_larger_product(fan_in, fan_out):
    """SmolLM2's and Gemma3's down projections, where oneDNN's one-row kernel rounds some rows otherwise (5 and 9
    of 64 rows on an AMD EPYC without AMX), and SmolLM2's lm_head: a product of 1 to 48 rows, and each row alone,
    gives the rows of the 48-row product bit for bit (one to three rows run padded to `ONEDNN_MIN_ROWS`)."""
    layer = _linear(fan_in, fan_out, seed=3)
    pack_linear_weights(layer)
    x = torch.randn(48, fan_in, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        batch = layer(x)
        for rows in range(1, 48):
            assert torch.equal(layer(x[:rows]), batch[:rows]), f"{rows} rows"
        for row in range(48):
            assert torch.equal(layer(x[row : row + 1].reshape(1, 1, fan_in))[0, 0], batch[row]), f"row {row} alone"
    torch.testing.assert_close(batch.double(), _reference(layer, x), rtol=2**-8, atol=2e-2)


def test_bfloat16_rows_are_exact_here_with_packing_and_not_without(monkeypatch):
    """The measured check holds on this CPU (the claim the row-exact batch tests rest on), and packing turned off
    makes it False (unpacked products differ from one row on)."""
    assert bfloat16_rows_exact()
    monkeypatch.setenv(PACKING_VARIABLE, "0")
    assert not bfloat16_rows_exact()


def test_the_rows_exact_check_fails_where_one_row_rounds_otherwise(monkeypatch):
    """A kernel whose one-row product is off by a bf16 ulp somewhere: the measurement says so."""
    real_forward = PackedLinear.forward

    def one_row_off(self, input):
        output = real_forward(self, input)
        return output * (1 + 2**-7) if input.numel() == input.shape[-1] else output

    monkeypatch.setattr(PackedLinear, "forward", one_row_off)
    packed_linear._rows_exact_here.cache_clear()
    try:
        assert not packed_linear._rows_exact_here()
    finally:
        packed_linear._rows_exact_here.cache_clear()
