"""A GGUF file's metadata and tensor table, parsed with `struct` over a memory map.

Format: ggml's GGUF specification (github.com/ggml-org/ggml, docs/gguf.md), versions 2 and 3,
little-endian: magic "GGUF", version u32, tensor count u64, metadata count u64; each metadata
pair a string key (u64 length + UTF-8 bytes), a u32 value type and the value; each tensor a
string name, u32 dimension count, u64 dimensions (innermost first), u32 ggml type and u64 offset
into the data section, which starts at the next multiple of `general.alignment` (default 32).

Why not `gguf.GGUFReader`: it builds numpy views for every element of every metadata array, and
SmolLM2's tokenizer arrays hold ~98,000 strings, so opening the file took 2.5 s of CPU at every
server start, replica and in-process load, against 0.04 s here (process_time, medians of 3). Tensor data are numpy views
of the map laid out as `GGUFReader` lays them out (the shapes `engine/gguf_blocks.py` reads).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# metadata value type -> struct format of one little-endian value (8 = string, 9 = array: below)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                   11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# tensor types GGUFReader maps as typed values; every other type as its raw bytes
_TYPED = {
    gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of the file. `shape`: GGUF order (innermost dimension first, as `GGUFReader`'s
    `shape`); `data`: a read-only view of the map, shaped like `GGUFReader`'s (torch order; for
    block types uint8 with the last dimension in bytes, `gguf.quants.quant_shape_to_byte_shape`)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class GgufFile:
    """A parsed GGUF file: `fields` maps each metadata key to its value (int, float, bool or str;
    arrays of numbers as numpy arrays, arrays of strings as lists of `bytes`, never decoded here:
    the tokenizer's vocabulary, which transformers reads itself); `tensors` in file order."""

    fields: dict[str, Any]
    tensors: list[GgufTensor]


class _Cursor:
    """Reads little-endian values from `buffer` at a moving offset; struct.error past the end."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def raw_string(self) -> bytes:
        length = self.unpack("<Q")
        if self.pos + length > len(self.buffer):
            raise ValueError(f"a string of {length} bytes at offset {self.pos} runs past the end of the file")
        value = self.buffer[self.pos:self.pos + length]
        self.pos += length
        return value

    def string(self) -> str:
        return self.raw_string().decode("utf-8")

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            return self.array(item_type, count)
        if value_type not in _SCALAR_FORMATS:
            raise ValueError(f"unknown GGUF metadata value type {value_type} at offset {self.pos}")
        return self.unpack(_SCALAR_FORMATS[value_type])

    def array(self, item_type: int, count: int) -> Any:
        if item_type == _STRING:
            return [self.raw_string() for _ in range(count)]
        if item_type == _ARRAY:
            return [self.value(_ARRAY) for _ in range(count)]
        if item_type not in _SCALAR_FORMATS:
            raise ValueError(f"unknown GGUF array item type {item_type} at offset {self.pos}")
        dtype = np.dtype(_SCALAR_FORMATS[item_type].replace("?", "b1"))
        values = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.pos)
        self.pos += dtype.itemsize * count
        return values


def read_gguf(path: str) -> GgufFile:
    """Memory-map and parse the GGUF file at `path` (see the module docstring for the format).

    Raises OSError when the file cannot be opened or mapped, ValueError when it is not a GGUF file
    of a supported version (big-endian files included), is truncated, or is malformed (unknown
    value or tensor type, duplicate key or tensor name, bad alignment, data past the end)."""
    with open(path, "rb") as handle:
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buffer)
    except struct.error as exc:
        raise ValueError(f"truncated GGUF file: {exc}") from exc


def _parse(buffer: mmap.mmap) -> GgufFile:
    cursor = _Cursor(buffer)
    if buffer[:4] != GGUF_MAGIC:
        raise ValueError("GGUF magic invalid")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"GGUF version {version} (read little-endian) is not supported: versions "
                         f"{SUPPORTED_VERSIONS}, little-endian only")
    tensor_count, field_count = cursor.unpack("<Q"), cursor.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(field_count):
        key = cursor.string()
        if key in fields:
            raise ValueError(f"duplicate GGUF metadata key {key!r}")
        fields[key] = cursor.value(cursor.unpack("<I"))
    table = [_tensor_entry(cursor) for _ in range(tensor_count)]
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"invalid general.alignment {alignment!r}: must be a power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    names: set[str] = set()
    tensors = []
    for name, dims, tensor_type, offset in table:
        if name in names:
            raise ValueError(f"duplicate GGUF tensor {name!r}")
        names.add(name)
        tensors.append(_tensor(buffer, name, dims, tensor_type, data_start + offset))
    return GgufFile(fields, tensors)


def _tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, int]:
    name = cursor.string()
    dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
    raw_type = cursor.unpack("<I")
    try:
        tensor_type = gguf.GGMLQuantizationType(raw_type)
    except ValueError as exc:
        raise ValueError(f"GGUF tensor {name} has unknown ggml type {raw_type}") from exc
    return name, dims, tensor_type, cursor.unpack("<Q")


def _tensor(buffer: mmap.mmap, name: str, dims: tuple[int, ...], tensor_type: gguf.GGMLQuantizationType,
            start: int) -> GgufTensor:
    torch_order = tuple(reversed(dims))
    num_elements = int(np.prod(dims, dtype=np.int64))
    block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
    if tensor_type in _TYPED:
        dtype, count, shape = np.dtype(_TYPED[tensor_type]), num_elements, torch_order
    else:
        dtype, count = np.dtype(np.uint8), num_elements * type_size // block_size
        shape = gguf.quants.quant_shape_to_byte_shape(torch_order, tensor_type)
    if start + count * dtype.itemsize > len(buffer):
        raise ValueError(f"GGUF tensor {name} runs past the end of the file")
    data = np.frombuffer(buffer, dtype=dtype, count=count, offset=start).reshape(shape)
    return GgufTensor(name, tensor_type, dims, data)
