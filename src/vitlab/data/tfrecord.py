"""Reading a tfds data_dir without TensorFlow: TFRecord files of `tf.train.Example` protos.

A TFRecord file is a sequence of records, each

    uint64 length | uint32 masked crc of length | length bytes | uint32 masked crc of data

(little-endian); both checksums (CRC-32C, masked) are verified, by google-crc32c, before a
record is used, so a damaged byte is refused rather than read as another label. Each record
here is an Example: a map from feature name to a list of
bytes, floats or int64s. tfds flattens nested features into names joined by "/" (CLEVR's
`objects/size`) and stores images encoded (PNG or JPEG). The wire format is read with the
few rules of protobuf it needs (varints and length-delimited fields), so no generated code
and no TensorFlow are involved; nothing in a file is ever executed.

tfds names its shards NAME-SPLIT.tfrecord-00000-of-00016 under NAME/[CONFIG/]VERSION/, and
reads them, unshuffled, in shard order: that order is the one VTAB's slices refer to. Which
config and version is read is the caller's choice (`prepared` lists them).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import google_crc32c

from vitlab.data.datasets import DataError

_SHARD = re.compile(r"^.+-(\w+)\.tfrecord-(\d+)-of-(\d+)$")


_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def prepared(builder_dir: Path) -> list[tuple[str, str, Path]]:
    """(config, version, folder) of every prepared copy under a tfds builder folder: a
    BUILDER/[CONFIG/]VERSION folder with tfds's dataset_info.json; config "" for none."""
    if not builder_dir.is_dir():
        return []
    found = []
    for info in builder_dir.glob("*/dataset_info.json"):
        found.append(("", info.parent.name, info.parent))
    for info in builder_dir.glob("*/*/dataset_info.json"):
        found.append((info.parent.parent.name, info.parent.name, info.parent))
    return sorted(f for f in found if _VERSION.match(f[1]))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def shards(folder: Path) -> dict[str, list[Path]]:
    """{split: shard files in order} of one prepared tfds folder (BUILDER/[CONFIG/]VERSION)."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for f in folder.iterdir():
        m = _SHARD.match(f.name)
        if m:
            found.setdefault(m.group(1), []).append((int(m.group(2)), f))
    return {s: [f for _, f in sorted(fs)] for s, fs in found.items()}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a message: value an int (varint, fixed) or bytes."""
    pos = 0
    value: int | bytes
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        else:
            raise DataError(f"not a tf.train.Example (wire type {wire})")
        yield number, wire, value


def _values(feature: bytes) -> list[Any]:
    """A Feature: bytes_list (1), float_list (2) or int64_list (3), packed or not."""
    for kind, _, body in _fields(feature):
        out: list[Any] = []
        for _, wire, v in _fields(body):
            if kind == 1:
                out.append(bytes(v))
            elif kind == 2:
                out += struct.unpack(f"<{len(v) // 4}f", v) if wire == 2 else struct.unpack("<f", v)
            else:
                ints, pos = [], 0
                while wire == 2 and pos < len(v):
                    x, pos = _varint(v, pos)
                    ints.append(x)
                out += [x - (1 << 64) if x >= 1 << 63 else x for x in (ints if wire == 2 else [v])]
        return out
    return []


def parse_example(record: bytes) -> dict[str, list[Any]]:
    """A serialized tf.train.Example -> {feature name: list of values}."""
    out = {}
    for number, _, features in _fields(record):
        if number != 1:
            continue
        for _, _, entry in _fields(features):  # map<string, Feature> entries
            parts = {n: v for n, _, v in _fields(entry)}
            out[bytes(parts.get(1, b"")).decode()] = _values(parts.get(2, b""))
    return out


def _damaged(path: Path, pos: int, what: str) -> DataError:
    return DataError(f"{path}: the record at byte {pos} fails its {what} checksum: the file is damaged; prepare it again",
                     reason="checksum")


class Records:
    """The records of some TFRecord files in order, indexed by offset and parsed on demand;
    each length's checksum is checked while indexing, each record's when it is read."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self.index: list[tuple[int, int, int]] = []  # (file, offset of the data, length)
        for k, path in enumerate(self.files):
            size, pos = path.stat().st_size, 0
            with open(path, "rb") as f:
                while pos < size:
                    head = f.read(12)
                    if len(head) < 12:
                        raise DataError(f"{path}: truncated TFRecord file at byte {pos}")
                    if struct.unpack("<I", head[8:])[0] != masked_crc(head[:8]):
                        raise _damaged(path, pos, "length")
                    (length,) = struct.unpack("<Q", head[:8])
                    self.index.append((k, pos + 12, length))
                    pos += 12 + length + 4
                    f.seek(pos)
            if pos != size:
                raise DataError(f"{path}: truncated TFRecord file (a record runs past its end)")

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, list[Any]]:
        k, offset, length = self.index[i]
        with open(self.files[k], "rb") as f:
            f.seek(offset)
            data = f.read(length + 4)
        if len(data) != length + 4 or struct.unpack("<I", data[length:])[0] != masked_crc(data[:length]):
            raise _damaged(self.files[k], offset - 12, "data")
        return parse_example(data[:length])


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
