"""float32 Linear layers packed once for oneDNN, the float32 kernel on AMD CPUs (`rift_ada.packed_linear`): the
rule that picks the kernel, products within float32 rounding of the float64 product, never a stale copy, and a
closed-loop batch whose requests give what they give alone."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tiny_models import ragged_forced_requests, tiny_model

from rift_ada import packed_linear
from rift_ada.packed_linear import (
    FLOAT32_PACKING_VARIABLE,
    PackedLinear,
    float32_packing,
    onednn_float32_available,
    pack_linear_weights,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_onednn = pytest.mark.skipif(not onednn_float32_available(), reason="this torch build has no oneDNN Linear")


@pytest.fixture
def onednn_kernel(monkeypatch):
    monkeypatch.setenv(FLOAT32_PACKING_VARIABLE, "onednn")


@pytest.mark.parametrize(
    ("vendor", "setting", "kernel"),
    [("AuthenticAMD", None, "onednn"), ("GenuineIntel", None, "mkl"), ("", None, "mkl"),
     ("GenuineIntel", "onednn", "onednn"), ("AuthenticAMD", " MKL ", "mkl")],
)  # fmt: skip
def test_the_float32_kernel_is_onednn_on_amd_and_mkl_elsewhere_unless_set(monkeypatch, vendor, setting, kernel):
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: vendor)
    if setting is None:
        monkeypatch.delenv(FLOAT32_PACKING_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(FLOAT32_PACKING_VARIABLE, setting)
    assert float32_packing() == kernel


def test_a_bad_kernel_setting_is_named_before_any_model_loads(monkeypatch, tmp_path):
    from rift_ada.models import ModelError, load_model

    monkeypatch.setenv(FLOAT32_PACKING_VARIABLE, "cublas")
    with pytest.raises(ModelError, match=f"{FLOAT32_PACKING_VARIABLE}='cublas': expected one of mkl, onednn"):
        load_model(str(tmp_path / "no-such-model"), dtype="float32")  # the setting, not the missing model


def test_the_cpu_vendor_is_read_from_linux():
    assert (
        packed_linear.cpu_vendor() in ("AuthenticAMD", "GenuineIntel", "") or packed_linear.cpu_vendor().isprintable()
    )


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 96), (2, 96), (16, 96), (17, 96), (4, 12, 96), (192, 96), (449, 96)])
def test_a_onednn_float32_linear_is_the_product_within_float32_rounding(onednn_kernel, shape):
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 160)
    assert pack_linear_weights(layer) == 1 and type(layer) is PackedLinear
    x = torch.randn(*shape)
    with torch.no_grad():
        out = layer(x)
        reference = x.double() @ layer.weight.double().T + layer.bias.double()
    assert out.dtype == torch.float32 and out.shape == (*shape[:-1], 160)
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)
    assert not torch.equal(out, torch.zeros_like(out))


@needs_onednn
@pytest.mark.parametrize(("fan_in", "fan_out"), [(1536, 576), (2048, 640)])
def test_every_onednn_float32_row_count_gives_each_row_its_bits_in_a_larger_product(onednn_kernel, fan_in, fan_out):
    """The down projections, where oneDNN's one-row float32 kernel rounds every row otherwise (64 of 64 rows on an
    AMD EPYC): a product of 1 to 48 rows, and each row alone, gives the rows of the 48-row product bit for bit."""
    torch.manual_seed(2)
    layer = torch.nn.Linear(fan_in, fan_out)
    pack_linear_weights(layer)
    x = torch.randn(48, fan_in)
    with torch.no_grad():
        batch = layer(x)
        for rows in range(1, 48):
            assert torch.equal(layer(x[:rows]), batch[:rows]), f"{rows} rows"
        for row in range(48):
            assert torch.equal(layer(x[row])[None], batch[row : row + 1]), f"row {row} alone"  # a 1-D input too


@needs_onednn
def test_a_rewritten_or_copied_onednn_float32_weight_is_packed_again(onednn_kernel):
    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 48)
    pack_linear_weights(layer)
    x = torch.randn(16, 64)
    with torch.no_grad():
        layer(x)
        layer.weight.mul_(-2)  # an optimizer step: the copy of the old weight must not be read
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            other.weight.mul_(0.5)
            torch.testing.assert_close(other(x), torch.nn.functional.linear(x, other.weight, other.bias))
    out = layer(x)  # autograd with a trainable weight takes the plain path
    out.sum().backward()
    assert torch.equal(layer.weight.grad, x.sum(0).expand(48, 64))


@needs_onednn
def test_a_onednn_float32_model_runs_a_closed_loop_batch_as_each_request_alone(onednn_kernel):
    """20 ragged teacher-forced and free requests at batches of 16 (continuous) and 20 on a oneDNN-packed float32
    llama: tokens, accepted counts and refreshes are each request's alone on the same model, and its draft
    entropies are the plain model's within float32 rounding."""
    from rift_ada.speculative import speculative_generate_batch

    plain = tiny_model("llama", seed=9)
    packed = copy.deepcopy(plain)
    assert pack_linear_weights(packed) > 0
    assert all(
        isinstance(m._rift_packed, packed_linear._PackedWeight) for m in packed.modules() if isinstance(m, PackedLinear)
    )

    alone = [speculative_generate_batch(packed, [request], draft_length=4)[0] for request in ragged_forced_requests()]
    plain_runs = speculative_generate_batch(plain, ragged_forced_requests(), draft_length=4, max_batch=20)
    for max_batch in (16, 20):
        batched = speculative_generate_batch(packed, ragged_forced_requests(), draft_length=4, max_batch=max_batch)
        for index, (got, want, plain_run) in enumerate(zip(batched, alone, plain_runs, strict=True)):
            label = f"batch {max_batch} request {index}"
            assert got.tokens == want.tokens, label
            assert [(r.accepted, r.refreshed) for r in got.rounds] == [(r.accepted, r.refreshed) for r in want.rounds]
            got_entropies = [e for r in got.rounds for e in r.draft_entropies]
            plain_entropies = [e for r in plain_run.rounds for e in r.draft_entropies]
            assert got.tokens == plain_run.tokens, label
            assert got_entropies == pytest.approx(plain_entropies, abs=1e-5), label
    assert sum(result.refreshes for result in alone) > 0


@pytest.mark.parametrize(
    ("kernel", "dtype"), [("onednn", torch.float32), ("mkl", torch.float32), (None, torch.bfloat16)]
)
def test_a_frozen_packed_linear_passes_the_gradient_to_its_input(monkeypatch, kernel, dtype):
    """A LoRA adapter's base Linear is frozen and its input needs a gradient: the packed ops have no backward
    (their gradient is silently None), so such a call takes ``F.linear`` and the input's gradient is its."""
    if kernel is not None:
        monkeypatch.setenv(FLOAT32_PACKING_VARIABLE, kernel)
    torch.manual_seed(2)
    layer = torch.nn.Linear(32, 24).to(dtype)
    if not pack_linear_weights(layer):
        pytest.skip(f"this torch build packs no {dtype} Linear")
    layer.requires_grad_(False)
    with torch.no_grad():
        for _ in range(10):  # past MKL's packing threshold at 16 rows
            layer(torch.randn(16, 32, dtype=dtype))
    x = torch.randn(16, 32, dtype=dtype, requires_grad=True)
    layer(x).square().sum().backward()
    expected = x.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(expected, layer.weight, layer.bias).square().sum().backward()
    assert x.grad is not None and torch.equal(x.grad, expected.grad)
