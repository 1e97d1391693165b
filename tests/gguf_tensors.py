"""Read tensors straight out of a GGUF file, independently of transformers' GGUF loader.

A minimal reader of the GGUF layout (header, metadata skipped, tensor infos, aligned data); the
blocks are de-quantised by the ``gguf`` package's numpy kernels. `gguf.GGUFReader` would also do,
but it builds a view per metadata item and takes ~30 s on Gemma3's 262K-token vocabulary.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np
import torch

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, data: mmap.mmap):
        self.data, self.offset = data, 0

    def read(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        length = self.read("Q")
        self.offset += length
        return bytes(self.data[self.offset - length : self.offset]).decode("utf-8")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.read("I"), self.read("Q")
            if item_kind in _SCALARS:  # skipped in one step: no metadata array is needed here
                self.offset += count * struct.calcsize("<" + _SCALARS[item_kind])
                return None
            return [self.value(item_kind) for _ in range(count)]
        return self.read(_SCALARS[kind])


def read_gguf_tensors(path: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """``names`` (GGUF tensor names) de-quantised to float32 tensors in numpy (row-major) order."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        magic, _version, n_tensors, n_metadata = cursor.read("4sIQQ")
        assert magic == b"GGUF", f"{path}: not a GGUF file"
        alignment = 32
        for _ in range(n_metadata):
            key = cursor.string()
            value = cursor.value(cursor.read("I"))
            if key == "general.alignment":
                alignment = int(value)
        infos = {}
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.read("Q") for _ in range(cursor.read("I"))]
            infos[name] = (dims, GGMLQuantizationType(cursor.read("I")), cursor.read("Q"))
        start = -(-cursor.offset // alignment) * alignment
        tensors = {}
        for name in names:
            dims, kind, offset = infos[name]
            block, block_bytes = GGML_QUANT_SIZES[kind]
            shape = list(reversed(dims))
            row_bytes = shape[-1] // block * block_bytes
            size = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
            raw = np.frombuffer(data, dtype=np.uint8, count=size, offset=start + offset)
            values = dequantize(raw.reshape(*shape[:-1], row_bytes), kind)
            tensors[name] = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
            del raw
        return tensors
