"""Writing TFRecord files of tf.train.Example protos, the inverse of vitlab.data.tfrecord's
reader, for the VTAB tests' hand-made tfds folders (the library reads tfds data, it never
writes any)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from vitlab.data.tfrecord import masked_crc


def _put_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _put_varint(number << 3 | 2) + _put_varint(len(payload)) + payload


def write_example(features: dict[str, list[Any]]) -> bytes:
    """A tf.train.Example of {name: bytes | [floats] | [ints]}: the inverse of parse_example."""
    entries = b""
    for name, values in features.items():
        if values and isinstance(values[0], bytes):
            feature = _field(1, b"".join(_field(1, v) for v in values))
        elif values and isinstance(values[0], float):
            feature = _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
        else:
            feature = _field(3, _field(1, b"".join(_put_varint(v & (1 << 64) - 1) for v in values)))
        entries += _field(1, _field(1, name.encode()) + _field(2, feature))
    return _field(1, entries)


def write_records(path: Path, records: list[bytes]) -> None:
    """A TFRecord file with its checksums, as TensorFlow writes one."""
    with open(path, "wb") as f:
        for r in records:
            length = struct.pack("<Q", len(r))
            f.write(length + struct.pack("<I", masked_crc(length)) + r + struct.pack("<I", masked_crc(r)))
