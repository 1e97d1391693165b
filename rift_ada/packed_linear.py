"""bfloat16 Linear layers on the CPU with their weights packed once for oneDNN, instead of at every call.

``torch.nn.functional.linear`` in bfloat16 on the CPU hands oneDNN a plain (out, in) weight, which it
re-lays into its blocked format at every call. At a decode step's few rows that re-layout can cost as much
as the product: on a CPU with AMX (Intel Xeon, ``amx_bf16``) SmolLM2-135M's MLP and attention products at
1-32 rows ran 1.3-3.1x faster (over three runs) from a weight packed once
(``torch.ops.mkldnn._reorder_linear_weight``, the packing torch.compile's CPU backend does when it freezes
weights), 0.94-1.3x at a prefill's 384-448 rows, with outputs equal bit for bit to ``F.linear``'s
(benchmarks/investigations/packed_linear.py). End to end that was 1.05x on the bf16 closed loop and the
probe, and none on target generation, at +0.47 GiB of RSS for SmolLM2
(docs/notes/2026-12-05-amx-packed-weights-sdpa.md). float32 gained nothing and changed
the rounding there, so only bfloat16 is packed.

`pack_linear_weights` makes each such Linear a `PackedLinear` that reads the packed copy; its parameters
and the model's state dict are unchanged. A weight written in place since it was packed
(training, ``load_state_dict``) is packed again at its next call; a call under autograd with a trainable
weight, with an input or weight on another device or of another dtype, or under torch.compile goes through
``F.linear`` as before.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["PACKING_VARIABLE", "PackedLinear", "packing_available", "pack_linear_weights", "packed_linear_count"]

PACKING_VARIABLE = "RIFT_ADA_PACKED_LINEAR"  # "0" turns packing off (a comparison, a suspect kernel)
ROWS_HINT = 32  # the rows oneDNN packs for (a decode batch's); the outputs measured exact from 1 to 448 rows


def packing_available() -> bool:
    """oneDNN with bfloat16 support in this torch build, and packing not turned off by the environment."""
    if os.environ.get(PACKING_VARIABLE, "1") == "0":
        return False
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):  # a build without these ops
        return False


class _PackedWeight:
    """A Linear's packed weight and which weight it was packed from (its storage and in-place version). A copy
    (``copy.deepcopy`` of the model) starts unpacked and packs its own weight at its first call: oneDNN's
    packed tensors have no storage to copy."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.source: tuple[int, int] = (0, -1)

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        source = (weight.data_ptr(), weight._version)
        if self.tensor is None or self.source != source:
            with torch.no_grad():
                self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
            self.source = source
        return self.tensor

    def __deepcopy__(self, memo: dict[int, Any]) -> _PackedWeight:
        return _PackedWeight()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


class PackedLinear(torch.nn.Linear):
    """A bfloat16 CPU Linear that reads its weight packed for oneDNN (`pack_linear_weights` makes them)."""

    _rift_packed: _PackedWeight

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            input.dtype != torch.bfloat16
            or input.device.type != "cpu"
            or weight.dtype != torch.bfloat16
            or weight.device.type != "cpu"
            or (torch.is_grad_enabled() and weight.requires_grad)
            or torch.compiler.is_compiling()  # dynamo cannot trace oneDNN's packed tensor; inductor packs its own
        ):
            return torch.nn.functional.linear(input, weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(input, self._rift_packed.of(weight), self.bias, "none", [], "")


def pack_linear_weights(model: torch.nn.Module) -> int:
    """Pack every bfloat16 CPU Linear of ``model`` for oneDNN (see the module docstring); returns how many.

    A no-op (0) where `packing_available` is False; idempotent. A tied weight (an lm_head that is the
    embedding) is packed as its own copy: the embedding's size again in memory."""
    if not packing_available():
        return 0
    packed = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear:
            continue
        weight = module.weight
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            continue
        module._rift_packed = _PackedWeight()
        module._rift_packed.of(weight)
        module.__class__ = PackedLinear
        packed += 1
    return packed


def packed_linear_count(model: Any) -> int:
    """How many of ``model``'s Linear layers read a packed weight (0 for a model `pack_linear_weights` never saw)."""
    return sum(1 for module in model.modules() if isinstance(module, PackedLinear))
