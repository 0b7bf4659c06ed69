"""engine/gguf_header.py against gguf's own GGUFReader: the same metadata values and the same
tensor views (names, types, shapes, dtypes, bytes), on the SmolLM2 file and on a written file
holding every metadata value type; truncated and malformed files are ValueErrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.gguf_header import read_gguf
from tests.conftest import smollm2_gguf


def _plain(value: Any) -> Any:
    """A metadata value as GGUFReader's `contents()` gives it (strings decoded, arrays as lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def assert_same_as_gguf_reader(path: Path) -> None:
    ours, theirs = read_gguf(str(path)), gguf.GGUFReader(str(path))
    expected = {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert {key: _plain(value) for key, value in ours.fields.items()} == expected
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == reference.tensor_type, mine.name
        assert list(mine.shape) == [int(d) for d in reference.shape], mine.name
        assert mine.data.dtype == reference.data.dtype and mine.data.shape == reference.data.shape, mine.name
        assert np.array_equal(mine.data, reference.data), mine.name


def test_smollm2_file_reads_as_gguf_reader_reads_it() -> None:
    assert_same_as_gguf_reader(smollm2_gguf())


def write_every_type(path: Path, alignment: int = 64) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("general.alignment", alignment)
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -5)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -30000)
    writer.add_int32("t.i32", -7)
    writer.add_float32("t.f32", 1e-5)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "ünïcødé 日本")
    writer.add_uint64("t.u64", 2**40)
    writer.add_int64("t.i64", -(2**40))
    writer.add_float64("t.f64", 0.1)
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.strings", ["a", "", "<0x0A>", "é"])
    writer.add_array("t.bools", [True, False, True])
    writer.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b.weight", np.arange(6, dtype=np.float16).reshape(2, 3))
    q8_rows = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)   # one Q8_0 block per row: [2, 32]
    writer.add_tensor("c.weight", q8_rows, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_every_value_type_and_tensor_layout(tmp_path: Path) -> None:
    path = tmp_path / "every.gguf"
    write_every_type(path)
    assert_same_as_gguf_reader(path)
    fields = read_gguf(str(path)).fields
    assert fields["t.strings"] == [b"a", b"", b"<0x0A>", "é".encode()]   # kept as bytes
    assert fields["t.str"] == "ünïcødé 日本" and fields["t.bool"] is True


def test_truncated_and_malformed_files_are_value_errors(tmp_path: Path) -> None:
    path = tmp_path / "every.gguf"
    write_every_type(path)
    data = path.read_bytes()
    cases = {"short.gguf": data[:100], "magic.gguf": b"GGUX" + data[4:], "version.gguf": data[:4] + b"\x09" + data[5:],
             "no_data.gguf": data[:-132]}   # the last tensor's 68 bytes and its padding (< 64) cut
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError):
            read_gguf(str(tmp_path / name))
