"""CPU Linear layers reading packed weights: bfloat16 packed once for oneDNN, float32 for MKL per row count or,
on an AMD CPU, once for oneDNN.

``torch.nn.functional.linear`` in bfloat16 on the CPU hands oneDNN a plain (out, in) weight, which it
re-lays into its blocked format at every call. At a decode step's few rows that re-layout can cost as much
as the product: on a CPU with AMX (Intel Xeon, ``amx_bf16``) SmolLM2-135M's MLP and attention products at
1-32 rows ran 1.3-3.1x faster (over three runs) from a weight packed once
(``torch.ops.mkldnn._reorder_linear_weight``, the packing torch.compile's CPU backend does when it freezes
weights), 0.94-1.3x at a prefill's 384-448 rows, with outputs equal bit for bit to ``F.linear``'s
(benchmarks/investigations/packed_linear.py). End to end that was 1.05x on the bf16 closed loop and the
probe, and none on target generation, at +0.47 GiB of RSS for SmolLM2
(docs/notes/2026-12-05-amx-packed-weights-sdpa.md). oneDNN's float32 packing gained nothing and changed
the rounding there.

float32 goes to MKL instead (``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, what
torch.compile's CPU backend uses for frozen float32 weights). An MKL-packed weight serves one row count
(the batch size it was packed for; other row counts take ``F.linear``), so a float32 Linear packs lazily:
a row count of at least `MKL_MIN_ROWS` is packed at its `MKL_PACK_AFTER`-th call, and the `MKL_ROW_COUNTS`
most recently used row counts stay packed (a closed loop's draft steps and its verifications). On an Intel
Xeon with AMX, over SmolLM2-135M's 513 MiB of weights streamed from memory, the products ran 1.45x faster
at 16 rows, 1.35x at 32, 1.16x at 192, with outputs equal bit for bit to ``F.linear``'s at every row count
from 16 to 449 on SmolLM2's and Gemma3's shapes (below 16 MKL's packed kernel rounds differently, so those
stay plain); each packed row count holds about the weights' size again in memory
(docs/notes/2026-12-06-float32-mkl-packing.md).

On an AMD CPU MKL is the slower kernel: on an AMD EPYC (Zen 4) oneDNN's float32 product from a weight packed
once ran a pass over SmolLM2-135M's weights 1.75x faster than MKL's packed ones at 16 rows, 1.45x at 32, 1.19x
at 192 (MKL's packing gained nothing over ``F.linear`` there; at one row oneDNN is 1.16x ``F.linear``),
with each row's output the same at every row count from 2 (and from 1 for inputs of up to 640 features; one
row runs padded, below), at most 8e-6 from the float64 product (benchmarks/investigations/float32_kernels.py).
So `float32_packing` picks by the CPU's vendor: "onednn" on AMD (one packed copy serves every row count), "mkl"
elsewhere; the environment's `FLOAT32_PACKING_VARIABLE` overrides it. oneDNN's float32 rounding is not
``F.linear``'s, so float32 results differ in the last bits between the two kernels (as they do between CPUs); a
batch's rows still give the tokens of the requests alone (tests/test_onednn_float32_linear.py).

A bfloat16 product of at most `ROWS_HINT` rows gives each row the bits it gives alone (one row), and a
larger one does not (SmolLM2's and Gemma3's shapes differ from 33 rows on). Inside `rows_as_alone` (a batch
of requests' forward, `rift_ada.speculative`) a bfloat16 product of more rows runs in pieces of `ROWS_HINT`,
so a verification of 32 requests x 12 tokens gives each request the products it gets alone; a prefill (one
request) keeps the whole product (tests/test_packed_linear.py checks the pieces row for row). That holds for
oneDNN's AMX kernels, and for its AVX512-BF16 ones (a CPU without AMX, as an AMD EPYC Zen 4) once a product of
fewer than `ONEDNN_MIN_ROWS` rows runs padded with zero rows to that many: oneDNN takes another kernel for one
row, which rounds some rows of the down projections (1536 and 2048 inputs) otherwise, 4-9 of 64 rows in
bfloat16 and all 64 in float32, while every count from 2 rows up gives the rows of a 64-row product. Padded,
each row alone equals its row in a batch in both dtypes, at 0.91-1.30x the time of the rows as they are for one
to three rows (a pass over SmolLM2's weights on the Zen 4, benchmarks/investigations/small_row_products.py;
docs/notes/2026-12-07-one-row-kernel.md). `bfloat16_rows_exact` measures this once on the CPU it runs on.

`pack_linear_weights` makes each such Linear a `PackedLinear` that reads the packed copy; its parameters
and the model's state dict are unchanged. A weight written in place since it was packed
(training, ``load_state_dict``) is packed again at its next call; a call under autograd with a trainable
weight or an input that needs a gradient (a frozen Linear under a LoRA adapter: the packed ops have no
backward), with an input or weight on another device or of another dtype, or under torch.compile goes
through ``F.linear`` as before.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

__all__ = [
    "PACKING_VARIABLE",
    "PackedLinear",
    "bfloat16_rows_exact",
    "FLOAT32_PACKING_VARIABLE",
    "cpu_has_amx",
    "float32_packing",
    "mkl_packing_available",
    "onednn_float32_available",
    "packing_available",
    "pack_linear_weights",
    "passing_row_counts",
    "packed_linear_count",
    "rows_as_alone",
]

PACKING_VARIABLE = "RIFT_ADA_PACKED_LINEAR"  # "0" turns packing off (a comparison, a suspect kernel)
FLOAT32_PACKING_VARIABLE = "RIFT_ADA_FLOAT32_PACKING"  # "mkl" or "onednn": overrides `float32_packing`'s rule
FLOAT32_KERNELS = ("mkl", "onednn")
ROWS_HINT = 32  # the rows oneDNN packs for (a decode batch's); the outputs measured exact from 1 to 448 rows
ONEDNN_MIN_ROWS = 4  # a oneDNN product of fewer rows runs padded to this many (same rows, faster)
MKL_MIN_ROWS = 16  # below it MKL's packed float32 product rounds differently from F.linear's
MKL_PACK_AFTER = 8  # calls at a row count before it is packed: a one-off shape is not worth a copy
MKL_ROW_COUNTS = 2  # row counts kept packed per weight (each holds the weight's size again)


_pieces = threading.local()


@contextmanager
def _thread_flag(name: str) -> Iterator[None]:
    """The thread-local flag ``name`` set inside the block, as it was after it."""
    outer = getattr(_pieces, name, False)
    setattr(_pieces, name, True)
    try:
        yield
    finally:
        setattr(_pieces, name, outer)


def rows_as_alone() -> AbstractContextManager[None]:
    """bfloat16 packed products of more than `ROWS_HINT` rows run in pieces of `ROWS_HINT` rows inside it (a
    forward of a batch of requests: each row's products as the request alone gets them)."""
    return _thread_flag("active")


def passing_row_counts() -> AbstractContextManager[None]:
    """float32 MKL products inside it read a row count's packed copy where one exists, but neither count the call
    nor pack a new one: the shrinking row counts of a round's later draft steps (`rift_ada.speculative._draft`) come
    and go, and packing each of them would evict the steady ones (`MKL_ROW_COUNTS`). Their products are
    ``F.linear``'s, bit for bit the packed ones' (module docstring)."""
    return _thread_flag("passing")


def _turned_off() -> bool:
    return os.environ.get(PACKING_VARIABLE, "1") == "0"


def packing_available() -> bool:
    """oneDNN with bfloat16 support in this torch build, and packing not turned off by the environment."""
    if _turned_off():
        return False
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):  # a build without these ops
        return False


def bfloat16_rows_exact() -> bool:
    """Whether this CPU's packed bfloat16 products give each row of up to `ROWS_HINT` the bits it gets alone, so
    a bfloat16 batch gives each request what it gives alone: packing on, and `_rows_exact_here` measured once."""
    return packing_available() and _rows_exact_here()


ROWS_EXACT_SHAPES = ((1536, 576), (2048, 640), (576, 1536))  # (in, out): SmolLM2's and Gemma3's down projections


@functools.cache
def _rows_exact_here() -> bool:
    """On `ROWS_EXACT_SHAPES` (where oneDNN's one-row kernel was seen to round otherwise), seeded random weights
    and rows: every product of 1 to `ROWS_HINT` rows, and every row alone, equals those rows of the
    `ROWS_HINT`-row product, through `PackedLinear` (so with its padding)."""
    generator = torch.Generator().manual_seed(0)
    for fan_in, fan_out in ROWS_EXACT_SHAPES:
        layer = torch.nn.Linear(fan_in, fan_out, bias=False)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(fan_out, fan_in, generator=generator) * fan_in**-0.5)
        layer = layer.to(torch.bfloat16)
        pack_linear_weights(layer)
        x = torch.randn(ROWS_HINT, fan_in, generator=generator).to(torch.bfloat16)
        with torch.no_grad():
            batch = layer(x)
            if not all(torch.equal(layer(x[:rows]), batch[:rows]) for rows in range(1, ROWS_HINT)):
                return False
            if not all(torch.equal(layer(x[row : row + 1])[0], batch[row]) for row in range(ROWS_HINT)):
                return False
    return True


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon since Sapphire Rapids), which oneDNN and torch's CPU SDPA use in
    bfloat16."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe is not None and probe())


def mkl_packing_available() -> bool:
    """MKL's packed float32 Linear in this torch build, and packing not turned off by the environment."""
    return not _turned_off() and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def cpu_vendor() -> str:
    """The CPU's vendor string as Linux reports it ("AuthenticAMD", "GenuineIntel"), "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def float32_packing() -> str:
    """Which kernel float32 Linears pack for: ``$RIFT_ADA_FLOAT32_PACKING`` when set ("mkl" or "onednn"), else
    "onednn" on an AMD CPU (where MKL's products were the slower, see the module docstring) and "mkl" elsewhere."""
    chosen = os.environ.get(FLOAT32_PACKING_VARIABLE, "").strip().lower()
    if chosen:
        if chosen not in FLOAT32_KERNELS:
            raise ValueError(f"{FLOAT32_PACKING_VARIABLE}={chosen!r}: expected one of {', '.join(FLOAT32_KERNELS)}")
        return chosen
    return "onednn" if cpu_vendor() == "AuthenticAMD" else "mkl"


def onednn_float32_available() -> bool:
    """oneDNN's packed float32 Linear in this torch build, and packing not turned off by the environment."""
    return not _turned_off() and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class _FreshWhenCopied:
    """Packed copies that a deep copy or a pickle of the model does not carry: the copy starts empty (made from
    `_settings`, the constructor's keywords) and packs its own weight (oneDNN's packed tensors have no storage to
    copy)."""

    def _settings(self) -> dict[str, Any]:
        return {}

    def __deepcopy__(self, memo: dict[int, Any]) -> _FreshWhenCopied:
        return type(self)(**self._settings())

    def __getstate__(self) -> dict[str, Any]:
        return self._settings()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


class _PackedWeight(_FreshWhenCopied):
    """A Linear's oneDNN-packed weight of one dtype (bfloat16; float32 on AMD) and which weight it was packed from
    (its storage and in-place version). A weight converted to another dtype since takes ``F.linear``."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype
        self.tensor: torch.Tensor | None = None
        self.source: tuple[int, int] = (0, -1)

    def _settings(self) -> dict[str, Any]:
        return {"dtype": self.dtype}

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        source = (weight.data_ptr(), weight._version)
        if self.tensor is None or self.source != source:
            with torch.no_grad():
                self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
            self.source = source
        return self.tensor


class _MklPackedWeights(_FreshWhenCopied):
    """A float32 weight's MKL-packed copies, one per row count (`MKL_ROW_COUNTS` at most, the most recently
    used kept), and which weight they were packed from."""

    def __init__(self) -> None:
        self.packed: dict[int, torch.Tensor] = {}  # row count -> packed weight, least recently used first
        self.calls: dict[int, int] = {}  # unpacked row count -> calls so far
        self.source: tuple[int, int] = (0, -1)

    def for_rows(self, weight: torch.Tensor, rows: int) -> torch.Tensor | None:
        """The weight packed for ``rows`` rows, packing it now if this row count has earned it; else None."""
        if rows < MKL_MIN_ROWS:
            return None
        source = (weight.data_ptr(), weight._version)
        if source != self.source:  # a rewritten weight: every packed copy is stale
            self.packed.clear()
            self.calls.clear()
            self.source = source
        if getattr(_pieces, "passing", False):  # `passing_row_counts`: no count, no new copy, no reordering
            return self.packed.get(rows)
        packed = self.packed.pop(rows, None)
        if packed is None:
            self.calls[rows] = self.calls.get(rows, 0) + 1
            if self.calls[rows] < MKL_PACK_AFTER:
                return None
            del self.calls[rows]
            if len(self.packed) >= MKL_ROW_COUNTS:
                del self.packed[next(iter(self.packed))]
            with torch.no_grad():
                packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
        self.packed[rows] = packed  # now the most recently used
        return packed


def _padded_product(input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """oneDNN's product of fewer than `ONEDNN_MIN_ROWS` rows, run on the rows padded with zeros to that many: the
    kernel oneDNN takes for one row rounds other bits than the one of a batch's rows, and one to three rows run
    slower than four (module docstring)."""
    flat = input.reshape(rows, -1)
    padded = torch.cat([flat, flat.new_zeros(ONEDNN_MIN_ROWS - rows, flat.shape[1])])
    output = torch.ops.mkldnn._linear_pointwise(padded, packed, bias, "none", [], "")
    return output[:rows].reshape(*input.shape[:-1], -1)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd must see this product: the packed ops register no backward, and a gradient through them
    is silently None (a LoRA adapter's frozen base Linear has an input that needs one)."""
    return any(tensor is not None and tensor.requires_grad for tensor in tensors)


class PackedLinear(torch.nn.Linear):
    """A CPU Linear that reads its weight packed: for oneDNN in bfloat16, for MKL at its frequent row counts
    or for oneDNN in float32 (`float32_packing`; `pack_linear_weights` makes them)."""

    _rift_packed: _PackedWeight | _MklPackedWeights

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            input.dtype != weight.dtype
            or input.device.type != "cpu"
            or weight.device.type != "cpu"
            or (torch.is_grad_enabled() and _needs_grad(input, weight, self.bias))  # the packed ops have no backward
            or torch.compiler.is_compiling()  # dynamo cannot trace a packed tensor; inductor packs its own
        ):
            return torch.nn.functional.linear(input, weight, self.bias)
        packing = self._rift_packed
        if isinstance(packing, _PackedWeight) and packing.dtype == weight.dtype:
            packed = packing.of(weight)
            rows = input.numel() // weight.shape[1]
            if 0 < rows < ONEDNN_MIN_ROWS:
                return _padded_product(input, packed, self.bias, rows)
            if rows <= ROWS_HINT or weight.dtype != torch.bfloat16 or not getattr(_pieces, "active", False):
                return torch.ops.mkldnn._linear_pointwise(input, packed, self.bias, "none", [], "")
            pieces = [
                torch.ops.mkldnn._linear_pointwise(piece, packed, self.bias, "none", [], "")
                for piece in input.reshape(rows, -1).split(ROWS_HINT)
            ]
            return torch.cat(pieces).reshape(*input.shape[:-1], -1)
        if weight.dtype == torch.float32 and isinstance(packing, _MklPackedWeights):
            rows = input.numel() // weight.shape[1]
            packed = packing.for_rows(weight, rows)
            if packed is not None:
                return torch.ops.mkl._mkl_linear(input, packed, weight, self.bias, rows)
        return torch.nn.functional.linear(input, weight, self.bias)


def pack_linear_weights(model: torch.nn.Module) -> int:
    """Make every bfloat16 or float32 CPU Linear of ``model`` a `PackedLinear` (see the module docstring);
    returns how many. bfloat16 weights are packed for oneDNN now; float32 ones for MKL at their first
    frequent row counts, or for oneDNN now where `float32_packing` says so.

    bfloat16 needs `packing_available`, float32 `mkl_packing_available` or `onednn_float32_available`;
    idempotent. A tied weight (an lm_head that is the embedding) is packed as its own copy: the embedding's
    size again in memory."""
    float32_onednn = float32_packing() == "onednn"
    float32_ready = onednn_float32_available() if float32_onednn else mkl_packing_available()
    kinds = {torch.bfloat16: packing_available(), torch.float32: float32_ready}
    packed = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear:
            continue
        weight = module.weight
        if not kinds.get(weight.dtype, False) or weight.device.type != "cpu":
            continue
        if weight.dtype == torch.bfloat16 or float32_onednn:
            module._rift_packed = _PackedWeight(weight.dtype)
            module._rift_packed.of(weight)
        else:
            module._rift_packed = _MklPackedWeights()
        module.__class__ = PackedLinear
        packed += 1
    return packed


def packed_linear_count(model: Any) -> int:
    """How many of ``model``'s Linear layers read a packed weight (0 for a model `pack_linear_weights` never saw)."""
    return sum(1 for module in model.modules() if isinstance(module, PackedLinear))
