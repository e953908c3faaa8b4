"""A split read batch by batch from its TFRecords, for evaluation that must not hold it.

`export` and `quantize` run every format over the whole test split. At 100,000
test photos of 224 px the float inputs alone are 60 GB, so a `StoredSplit`
never holds more than one batch of images: each pass decodes the TFRecords
again (the pipeline's own decode and preprocess), in the shards' file order.
What the callers keep is per image and small: labels and probabilities (N x
classes). `stored_records` reads the same records without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

BATCH = 256  # images per batch: a few MB of float inputs at 96 px, 150 MB at 224 px x 3


@dataclass(frozen=True)
class StoredSplit:
    files: tuple[str, ...]
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    batch_size: int = BATCH

    @classmethod
    def of(cls, prepared, split: str = "test", batch_size: int = BATCH) -> StoredSplit:
        from tfmlops.data.tfrecords import shard_files

        return cls(tuple(shard_files(prepared.folder, split)), prepared.channels,
                   prepared.image_size, tuple(prepared.mean), tuple(prepared.std), batch_size)

    # A fresh process (the SavedModel's reload check) reads the same split from this.
    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> StoredSplit:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def batches(self, batch_size: int | None = None
                ) -> Iterator[tuple[list[bytes], np.ndarray, np.ndarray]]:
        """(stored bytes, float32 model inputs, labels) per batch, in file order."""
        for _, encoded, x, y in self.hashed_batches(batch_size):
            yield encoded, x, y

    def hashed_batches(self, batch_size: int | None = None
                       ) -> Iterator[tuple[list[str], list[bytes], np.ndarray, np.ndarray]]:
        """(content sha256s, stored bytes, float32 model inputs, labels) per batch, in file
        order: the hash names the image in prepare's manifest ("" in records without one)."""
        import tensorflow as tf

        from tfmlops.data.pipeline import FEATURES, decode_stored, preprocess

        features = {**FEATURES, "sha256": tf.io.FixedLenFeature([], tf.string, default_value="")}

        def parse(record):
            ex = tf.io.parse_single_example(record, features)
            image = decode_stored(ex["image"], self.channels)
            x = preprocess(image, self.image_size, self.mean, self.std)
            return ex["sha256"], ex["image"], x, ex["label"]

        ds = (tf.data.TFRecordDataset(list(self.files))
              .map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
              .batch(batch_size or self.batch_size)
              .prefetch(1))
        for sha, encoded, x, y in ds:
            yield ([h.decode() for h in sha.numpy()], list(encoded.numpy()),
                   x.numpy().astype(np.float32), y.numpy())

    def labels(self) -> np.ndarray:
        import tensorflow as tf

        from tfmlops.data.pipeline import FEATURES

        ds = (tf.data.TFRecordDataset(list(self.files))
              .map(lambda r: tf.io.parse_single_example(r, FEATURES)["label"])
              .batch(4096))
        return np.concatenate([y.numpy() for y in ds] or [np.zeros(0, np.int64)])

    @cached_property
    def first(self) -> tuple[bytes, np.ndarray]:
        """The first image: its stored bytes and its model input (a batch of one), read
        once (every latency and every example uses it)."""
        encoded, x, _ = next(self.batches(batch_size=1))
        return encoded[0], x

    def predict(self, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """`fn` over every batch of model inputs, concatenated (float32)."""
        return np.concatenate([np.asarray(fn(x), np.float32) for _, x, _ in self.batches()])

    def predict_encoded(self, fn: Callable[[list[bytes]], np.ndarray]) -> np.ndarray:
        """`fn` over every batch of stored bytes, concatenated (float32)."""
        return np.concatenate([np.asarray(fn(e), np.float32) for e, _, _ in self.batches()])

    def arrays(self) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """The whole split in memory (stored bytes, inputs, labels): for tests and
        benchmarks on small splits, never for a stage."""
        encoded, xs, ys = zip(*self.batches(), strict=True)
        return [e for batch in encoded for e in batch], np.concatenate(xs), np.concatenate(ys)


def stored_records(folder, split: str = "test", batch_size: int = BATCH
                   ) -> Iterator[tuple[list[str], list[bytes], np.ndarray]]:
    """(sha256 hex, stored bytes, labels) per batch of `split`'s TFRecords in `folder`,
    in the shards' file order, read record by record (no TensorFlow)."""
    from tfmlops.data.tfrecords import decode_example, read_records, shard_files

    batch: list[dict] = []
    for path in shard_files(folder, split):
        for record in read_records(path):
            batch.append(decode_example(record))
            if len(batch) == batch_size:
                yield _columns(batch)
                batch = []
    if batch:
        yield _columns(batch)


def _columns(examples: list[dict]) -> tuple[list[str], list[bytes], np.ndarray]:
    return ([bytes(e.get("sha256", b"")).decode() for e in examples],
            [e["image"] for e in examples],
            np.array([e["label"] for e in examples], np.int64))
