"""A GGUF file's tensor table, read without parsing its metadata arrays.

Why not gguf.GGUFReader: it builds a Python object for every element of every metadata array, and the
tokenizer's 262144 tokens, scores and types take it about 40 s on the default model's file. We only need
the tensors: the header's key-value pairs are skipped (string arrays by their length prefixes) and the
tensor data is memory-mapped."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, KEY_GENERAL_ALIGNMENT, GGMLQuantizationType, GGUFValueType

# fixed-size value types -> struct format (little-endian)
_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
            GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the innermost (in_features of a weight)
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # [rows, bytes per row] uint8 (memory-mapped)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (n,) = self.read("Q")
        text = bytes(self.buf[self.at : self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def value(self, kind: GGUFValueType, keep: bool) -> object:
        """Reads one value; arrays are skipped (None) unless `keep`."""
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            (inner,), (count,) = self.read("I"), self.read("Q")
            inner = GGUFValueType(inner)
            if inner in _SCALARS:
                self.at += count * struct.calcsize(_SCALARS[inner])
            else:
                for _ in range(count):
                    self.value(inner, keep=False)
            return None
        return self.read(_SCALARS[kind])[0]


def read_tensors(path: str | Path) -> dict[str, GGUFTensor]:
    """name -> GGUFTensor for every tensor of a GGUF (v2/v3) file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(raw))
    magic, version = cur.read("4sI")
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{path} is not a GGUF v2/v3 file")
    n_tensors, n_kv = cur.read("QQ")
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string()
        (kind,) = cur.read("I")
        value = cur.value(GGUFValueType(kind), keep=key == KEY_GENERAL_ALIGNMENT)
        if key == KEY_GENERAL_ALIGNMENT:
            alignment = int(value)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        (dims,) = cur.read("I")
        shape = cur.read("Q" * dims)
        kind, offset = cur.read("IQ")
        infos.append((name, tuple(int(d) for d in shape), GGMLQuantizationType(kind), offset))
    start = -(-cur.at // alignment) * alignment
    tensors = {}
    for name, shape, kind, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        row_bytes = shape[0] // block * block_bytes
        rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        data = raw[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, shape, kind, data)
    return tensors
