"""Write TFRecord shards of tf.train.Example records, without importing TensorFlow.

`prepare` streams images into the shards as they are decoded. Importing
TensorFlow costs about 10 s here, more than an incremental `prepare` of
thousands of photos, so the two formats are written directly: an Example is
three protobuf fields (encoded below, byte for byte as protobuf does, keys
sorted) and a TFRecord is length, masked CRC-32C, data, masked CRC-32C.
`tf.data.TFRecordDataset` and `tf.train.Example.FromString` read them
(tests/unit/test_store.py).
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import google_crc32c

from tfmlops.errors import DataError

# prepare writes three fields per image: the one-byte varints and the key fields are
# looked up, not rebuilt, per record.
_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    n &= (1 << 64) - 1  # negative int64 values are ten-byte varints
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: bytes | int) -> bytes:
    if isinstance(value, bytes):  # Feature.bytes_list (1) -> BytesList.value (1)
        return _field(1, _field(1, value))
    return _field(3, _field(1, _varint(value)))  # Feature.int64_list (3) -> Int64List.value (1, packed)


@functools.lru_cache(maxsize=256)
def _key(key: str) -> bytes:
    return _field(1, key.encode())  # the map entry's key


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """A serialized tf.train.Example of bytes and int64 features, in sorted key order."""
    entries = b"".join(
        _field(1, _key(key) + _field(2, _feature(value)))  # map entry
        for key, value in sorted(features.items())
    )
    return _field(1, entries)  # Example.features (1) -> Features.feature (1)


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def frame(record: bytes) -> bytes:
    """One TFRecord: uint64 length, masked CRC of it, the data, masked CRC of it."""
    length = struct.pack("<Q", len(record))
    return length + _masked_crc(length) + record + _masked_crc(record)


class ShardedWriter:
    """Records into `shards` files, each to the shard its caller names (`stream.shard_of`:
    a function of the record's content); shards no record went to are dropped
    (`place_shards`), as a writer that knew which would be used would have named them.
    At most `open_max` files are open at once (the machine's open-files limit,
    config.machine.fit_to_machine): beyond it, the least recently written one is closed
    and reopened for appending when its next record comes; the bytes are the same."""

    def __init__(self, folder: Path, split: str, shards: int, open_max: int | None = None):
        self.folder, self.split, self.shards = Path(folder), split, shards
        self.paths = [self.folder / f".{split}-{i:05d}.part" for i in range(shards)]
        self.open_max = max(1, open_max or shards)
        self.files: dict[int, object] = {}  # open ones, least recently written first
        self.counts = [0] * shards

    def write(self, record: bytes, shard: int) -> None:
        fh = self.files.pop(shard, None)
        if fh is None:
            if len(self.files) >= self.open_max:
                self.files.pop(next(iter(self.files))).close()
            fh = self.paths[shard].open("ab" if self.counts[shard] else "wb")
        self.files[shard] = fh
        fh.write(frame(record))
        self.counts[shard] += 1

    def close(self) -> list[Path]:
        for f in self.files.values():
            f.close()
        self.files.clear()
        return place_shards(self.folder, self.split,
                            {i: self.paths[i] for i, n in enumerate(self.counts) if n})


def place_shards(folder: Path, split: str, parts: dict[int, Path]) -> list[Path]:
    """Move the part files of `split` that hold records ({shard index: part}) to their
    final names, renumbered in order: `<split>-00000-of-00002.tfrecord`...; an empty
    split gets one empty file. Both engines name their shards so. The files, in order."""
    n = len(parts) or 1
    names = [Path(folder) / f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]
    if not parts:
        names[0].touch()
    for shard, name in zip(sorted(parts), names, strict=False):
        os.replace(parts[shard], name)
    return names


def shard_files(folder: str | Path, split: str) -> list[str]:
    """The shards of `split` in `folder`, in file order (the order every reader keeps);
    DataError when there are none (prepare has not run)."""
    files = sorted(str(p) for p in Path(folder).glob(f"{split}-*.tfrecord"))
    if not files:
        raise DataError(f"no {split} TFRecords in {folder}; run `dvc repro prepare`")
    return files


def read_records(path: str | Path):
    """The records of one TFRecord file, in order, one at a time (CRCs checked)."""
    with open(path, "rb") as fh:
        while header := fh.read(12):
            if len(header) < 12 or _masked_crc(header[:8]) != header[8:]:
                raise ValueError(f"{path}: truncated or corrupt TFRecord header")
            (length,) = struct.unpack("<Q", header[:8])
            record, crc = fh.read(length), fh.read(4)
            if len(record) < length or _masked_crc(record) != crc:
                raise ValueError(f"{path}: truncated or corrupt TFRecord")
            yield record


def decode_example(record: bytes) -> dict[str, bytes | int]:
    """A tf.train.Example of single bytes or int64 values -> {key: value}: the inverse
    of `encode_example` (lists of more than one value keep their first)."""
    out: dict[str, bytes | int] = {}
    for _, entries in _fields(record):  # Example.features
        for _, entry in _fields(entries):  # Features.feature map entries
            parts = dict(_fields(entry))
            key, feature = parts[1].decode(), parts.get(2, b"")
            for kind, values in _fields(feature):
                inner = dict(_fields(values)).get(1, b"")
                out[key] = inner if kind == 1 else _read_varint(inner, 0)[0]
    return out


def _fields(data: bytes):
    """(field number, payload) of the length-delimited fields of a protobuf message."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        if tag & 7 != 2:
            raise ValueError(f"unexpected protobuf wire type {tag & 7} in a tf.train.Example")
        size, pos = _read_varint(data, pos)
        yield tag >> 3, data[pos:pos + size]
        pos += size


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value - (1 << 64) if value >= 1 << 63 else value), pos
        shift += 7
