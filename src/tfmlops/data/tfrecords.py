"""Write validated images as TFRecord shards, one set per split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tensorflow as tf

from tfmlops.data.images import GoodImage


def _bytes(v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))


def _int(v: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))


def write_split(
    folder: Path, split: str, images: Sequence[GoodImage], label_index: dict[str, int], shards: int
) -> list[Path]:
    """Round-robin `images` (in the given order) over `shards` files."""
    shards = max(1, min(shards, len(images))) if images else 1
    paths = [folder / f"{split}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
    writers = [tf.io.TFRecordWriter(str(p)) for p in paths]
    try:
        for i, img in enumerate(images):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": _bytes(img.png),
                "label": _int(label_index[img.label]),
                "sha256": _bytes(img.sha256.encode()),
            }))
            writers[i % shards].write(example.SerializeToString())
    finally:
        for w in writers:
            w.close()
    return paths
