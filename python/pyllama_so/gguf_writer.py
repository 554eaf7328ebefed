"""A minimal GGUF (version 3) writer: metadata key/values and tensor data streamed from callbacks.

Only what the synthetic models need. Tensor data are written by a callback per tensor, so a model of
tens of GiB never has to be held in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf value types
_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64 = 4, 5, 6, 7, 8, 9, 10

# ggml tensor types: id, elements per block, bytes per block
GGML_TYPES: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "q8_0": (8, 32, 34),
    "bf16": (30, 1, 2),
}


def tensor_nbytes(ggml_type: str, n_elements: int) -> int:
    _, block, size = GGML_TYPES[ggml_type]
    if n_elements % block:
        raise ValueError(f"{n_elements} elements are not a whole number of {ggml_type} blocks")
    return n_elements // block * size


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (contiguous) first
    ggml_type: str

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, self.n_elements)


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v: object) -> bytes:
    if isinstance(v, bool):
        return struct.pack("<I?", _BOOL, v)
    if isinstance(v, int):
        return struct.pack("<Ii", _INT32, v) if v < 0 else struct.pack("<II", _UINT32, v)
    if isinstance(v, float):
        return struct.pack("<If", _FLOAT32, v)
    if isinstance(v, str):
        return struct.pack("<I", _STRING) + _string(v)
    if isinstance(v, np.ndarray):
        kinds = {np.dtype(np.int32): _INT32, np.dtype(np.float32): _FLOAT32, np.dtype(np.uint32): _UINT32}
        if v.dtype not in kinds:
            raise TypeError(f"unsupported array dtype {v.dtype}")
        data = np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")).tobytes()
        return struct.pack("<IIQ", _ARRAY, kinds[v.dtype], v.size) + data
    if isinstance(v, Sequence) and all(isinstance(x, str) for x in v):
        return struct.pack("<IIQ", _ARRAY, _STRING, len(v)) + b"".join(_string(x) for x in v)
    raise TypeError(f"unsupported metadata value {type(v).__name__}")


def write_gguf(path: Path, metadata: dict[str, object], tensors: Sequence[TensorSpec],
               write_data: Callable[[TensorSpec, BinaryIO], object],
               progress: Callable[[int, int], None] | None = None) -> None:
    """Write a GGUF file. write_data(spec, f) must write exactly spec.nbytes bytes."""
    kv = dict(metadata)
    kv.setdefault("general.alignment", ALIGNMENT)
    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kv)))
    for key, value in kv.items():
        header += _string(key) + _value(value)
    offset = 0
    for t in tensors:
        header += _string(t.name) + struct.pack("<I", len(t.shape)) + struct.pack(f"<{len(t.shape)}Q", *t.shape)
        header += struct.pack("<IQ", GGML_TYPES[t.ggml_type][0], offset)
        offset += -(-t.nbytes // ALIGNMENT) * ALIGNMENT
    header += b"\0" * (-len(header) % ALIGNMENT)

    total = sum(t.nbytes for t in tensors)
    done = 0
    tmp = path.with_name(path.name + ".part")
    try:
        with tmp.open("wb") as f:
            f.write(header)
            for t in tensors:
                start = f.tell()
                write_data(t, f)
                written = f.tell() - start
                if written != t.nbytes:
                    raise RuntimeError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
                f.write(b"\0" * (-written % ALIGNMENT))
                done += t.nbytes
                if progress is not None:
                    progress(done, total)
        tmp.replace(path)  # never leave a half-written file under the final name
    except BaseException:
        tmp.unlink(missing_ok=True)  # nor the unfinished one (an error or Ctrl-C)
        raise
