"""prepare's building blocks: TFRecord/Example bytes TensorFlow reads, the result
cache's crash safety, one image's stored form, progress lines."""

import logging
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from images import exif_rotated_jpeg, photo
from tfmlops.data.store import (
    ImageCache,
    Stored,
    StoreSpec,
    channel_sums,
    own_segment,
    store_bytes,
)
from tfmlops.data.tfrecords import ShardedWriter, encode_example
from tfmlops.progress import Progress
from tfmlops.stages.prepare.hash_memo import HashMemo, stat_key, trust_cutoff

SPEC = StoreSpec(channels=3, short_side=16, encoding="auto", jpeg_quality=90, image_size=16)


def test_records_are_read_by_tensorflow_as_written(tmp_path):
    import tensorflow as tf

    writer = ShardedWriter(tmp_path, "train", shards=3)
    written = [{"image": bytes([i]) * (i * 50), "label": i - 1, "sha256": f"{i:064x}".encode()}
               for i in range(5)]
    for i, features in enumerate(written):
        writer.write(encode_example(features), shard=i % 3)
    paths = writer.close()
    assert [p.name for p in paths] == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    read = []
    for p in paths:
        for record in tf.data.TFRecordDataset(str(p)):
            f = tf.train.Example.FromString(record.numpy()).features.feature
            read.append({"image": f["image"].bytes_list.value[0], "label": f["label"].int64_list.value[0],
                         "sha256": f["sha256"].bytes_list.value[0]})
    order = [0, 3, 1, 4, 2]  # each in the shard it was written to, in writing order
    assert read == [written[i] for i in order]
    for features in written:  # byte for byte what protobuf writes (map keys sorted)
        example = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[features["image"]])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[features["label"]])),
            "sha256": tf.train.Feature(bytes_list=tf.train.BytesList(value=[features["sha256"]])),
        }))
        assert encode_example(features) == example.SerializeToString(deterministic=True)


def test_shards_no_record_went_to_are_dropped_and_the_rest_renumbered(tmp_path):
    from tfmlops.data.tfrecords import frame

    writer = ShardedWriter(tmp_path, "test", shards=4)
    writer.write(encode_example({"label": 1}), shard=3)
    writer.write(encode_example({"label": 2}), shard=1)
    assert [p.name for p in writer.close()] == ["test-00000-of-00002.tfrecord",
                                                 "test-00001-of-00002.tfrecord"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test-00000-of-00002.tfrecord",
                                                           "test-00001-of-00002.tfrecord"]
    assert (tmp_path / "test-00000-of-00002.tfrecord").read_bytes() == \
        frame(encode_example({"label": 2}))  # shard 1 comes first


@settings(max_examples=25, deadline=None)
@given(shards=st.integers(1, 9), open_max=st.integers(1, 9),
       writes=st.lists(st.integers(0, 8), max_size=40))
def test_a_writer_with_few_files_open_writes_the_bytes_of_one_with_all_open(
        tmp_path_factory, shards, open_max, writes):
    """data.shards beyond the machine's open-files limit (config.machine.fit_to_machine):
    the least recently written shard is closed and reopened for appending."""
    out = {}
    for name, most in (("all", None), ("few", open_max)):
        folder = tmp_path_factory.mktemp(name)
        writer = ShardedWriter(folder, "train", shards, most)
        for i, shard in enumerate(writes):
            writer.write(encode_example({"label": i}), shard % shards)
            assert len(writer.files) <= (most or shards)
        out[name] = {p.name: p.read_bytes() for p in writer.close()}
    assert out["few"] == out["all"]


def test_statistics_are_those_of_the_image_tensorflow_resizes():
    """channel_sums must measure what the tf.data pipeline feeds: the stored image
    resized by tf.image.resize (bilinear), scaled to [0, 1]."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    # (23, 37): both sides resized, down and up; a side already at `size` (prepare's stored
    # short side) too; one channel as a 2-D array, as grayscale images are decoded.
    for shape, sizes in (((23, 37, 3), (8, 16, 50)), ((16, 37, 3), (16,)), ((37, 16, 3), (16,)),
                         ((23, 37), (16,))):
        x = rng.integers(0, 256, shape).astype(np.uint8)
        for size in sizes:
            sums, squares, count = channel_sums(x, size)
            image = x if x.ndim == 3 else x[..., None]
            resized = tf.image.resize(image.astype(np.float32), (size, size)).numpy() / 255.0
            flat = resized.reshape(-1, image.shape[-1]).astype(np.float64)
            assert count == size * size
            np.testing.assert_allclose(sums, flat.sum(0), rtol=1e-4)
            np.testing.assert_allclose(squares, (flat**2).sum(0), rtol=1e-4)


def test_stored_image_is_upright_reduced_and_encoded_by_source(tmp_path):
    exif_rotated_jpeg(tmp_path / "r.jpg", 80, 40)
    photo(np.random.default_rng(0), 50, 30, 0.5).save(tmp_path / "p.png")
    jpeg = store_bytes((tmp_path / "r.jpg").read_bytes(), SPEC)
    png = store_bytes((tmp_path / "p.png").read_bytes(), SPEC)
    assert jpeg.ok and jpeg.encoding == "jpeg" and jpeg.data[:3] == b"\xff\xd8\xff"
    assert jpeg.source_size == (40, 80) and jpeg.stored_size == (16, 32)
    assert png.encoding == "png" and png.stored_size == (27, 16) and png.pixels == 256
    (tmp_path / "e.png").write_bytes(b"")
    assert store_bytes((tmp_path / "e.png").read_bytes(), SPEC).reason == "zero-byte file"


def test_cache_ignores_entries_cut_short_or_damaged(tmp_path):
    cache = ImageCache(tmp_path, SPEC)
    entries = {f"{i:064x}": Stored(data=bytes([i]) * 100, encoding="png", source_size=(i, i),
                                   stored_size=(16, 16), sums=(1.0,), squares=(2.0,), pixels=256)
               for i in range(3)}
    for sha, stored in entries.items():
        cache.put(sha, stored)
    cache.put("f" * 64, Stored(reason="not an image"))
    cache.close()
    again = ImageCache(tmp_path, SPEC)
    assert again.get(f"{1:064x}") == entries[f"{1:064x}"]
    assert again.get("f" * 64).reason == "not an image"
    again.close()

    (seg,) = (tmp_path / again.folder.name).glob("*.seg")
    blob = seg.read_bytes()
    seg.write_bytes(blob[:-150])  # a kill in the middle of the last entries
    cut = ImageCache(tmp_path, SPEC)
    assert cut.has(f"{0:064x}") and not cut.has("f" * 64)
    cut.close()
    damaged = bytearray(blob)
    damaged[blob.index(bytes([2]) * 100) + 10] ^= 0xFF  # flipped bits inside an entry's data
    seg.write_bytes(bytes(damaged))
    bad = ImageCache(tmp_path, SPEC)
    assert bad.get(f"{2:064x}") is None and bad.get(f"{0:064x}") is not None
    bad.close()


def test_cache_compaction_keeps_only_live_entries_of_this_spec(tmp_path):
    other = ImageCache(tmp_path, StoreSpec(1, 16, "png", 90, 16))
    other.put("a" * 64, Stored(reason="x"))
    other.close()
    cache = ImageCache(tmp_path, SPEC)
    for c in "bcd":
        cache.put(c * 64, Stored(data=c.encode() * 10, encoding="png"))
    neighbours = [tmp_path / "0123456789abcdef", tmp_path / "notes"]  # no marker: not ours
    for n in neighbours:
        n.mkdir()
        (n / "keep.txt").write_text("someone else's")
    cache.compact({"b" * 64, "c" * 64})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", cache.folder.name] + [n.name for n in neighbours])
    assert all((n / "keep.txt").is_file() for n in neighbours)
    fresh = ImageCache(tmp_path, SPEC)
    assert set(fresh.index) == {"b" * 64, "c" * 64} and fresh.get("c" * 64).data == b"c" * 10


def test_progress_logs_done_rate_and_time_left(caplog):
    now = [0.0]
    progress = Progress(100, "prepare: images", seconds=5, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="tfmlops.progress"):
        for _ in range(40):
            now[0] += 0.25
            progress.update()
        progress.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "prepare: images: 20/100 (4.0/s, 20 s left)"
    assert lines[1] == "prepare: images: 40/100 (4.0/s, 15 s left)"
    assert lines[-1] == "prepare: images: 40/100 (4.0/s, 10.0 s)"
    assert len(lines) == 3


@pytest.mark.parametrize("seconds, text", [(42, "42 s"), (125, "2 min 05 s"), (7260, "2 h 01 min")])
def test_time_left_reads_well(seconds, text):
    from tfmlops.progress import _duration

    assert _duration(seconds) == text


def test_hash_memo_trusts_only_the_same_stat_and_not_a_racy_one(tmp_path):
    old = tmp_path / "old.jpg"
    old.write_bytes(b"old")
    os.utime(old, (1_700_000_000, 1_700_000_000))
    fresh = tmp_path / "fresh.jpg"
    fresh.write_bytes(b"fresh")
    memo = HashMemo(tmp_path / "memo.sqlite")
    assert memo.get(old, stat_key(old.stat())) is None  # no table yet
    memo.replace([(old, stat_key(old.stat()), "a" * 64), (fresh, stat_key(fresh.stat()), "b" * 64)],
                 trust_cutoff())
    again = HashMemo(tmp_path / "memo.sqlite")
    assert again.get(old, stat_key(old.stat())) == "a" * 64
    # written within the last seconds: may change again within one timestamp tick
    assert again.get(fresh, stat_key(fresh.stat())) is None
    size, mtime, inode, ctime, device = stat_key(old.stat())
    for changed in ((size + 1, mtime, inode, ctime, device), (size, mtime + 1, inode, ctime, device),
                    (size, mtime, inode + 1, ctime, device), (size, mtime, inode, ctime + 1, device),
                    (size, mtime, inode, ctime, device + 1)):
        assert again.get(old, changed) is None, changed
    again.close()
    (tmp_path / "memo.sqlite").write_bytes(b"not a database")
    assert HashMemo(tmp_path / "memo.sqlite").get(old, stat_key(old.stat())) is None


def test_cache_index_holds_a_few_values_per_entry_not_the_header(tmp_path):
    import tracemalloc

    cache = ImageCache(tmp_path, SPEC)
    for i in range(2000):
        cache.put(f"{i:064x}", Stored(data=b"x" * 50, encoding="jpeg", source_size=(1081, 910),
                                      stored_size=(115, 96), sums=(0.1, 0.2, 0.3),
                                      squares=(0.4, 0.5, 0.6), pixels=9216))
    cache.close()
    tracemalloc.start()
    reopened = ImageCache(tmp_path, SPEC)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(reopened.index) == 2000
    assert held / 2000 < 400  # bytes per entry; the parsed header alone was about 1,600
    assert reopened.get(f"{7:064x}").sums == (0.1, 0.2, 0.3)
    reopened.close()


def test_an_entry_reads_back_as_written_with_a_nan_or_a_64_bit_hash(tmp_path):
    """Headers are parsed by msgspec; what it refuses (NaN, which json.dumps writes) by json."""
    cache = ImageCache(tmp_path, SPEC)
    odd = Stored(data=b"x" * 50, encoding="png", sums=(float("nan"), 0.2, 0.3),
                 brightness=float("inf"), phash=2**64 - 1)
    cache.put("a" * 64, odd)
    cache.put("b" * 64, Stored(data=b"y" * 50, encoding="jpeg", sharpness=570.046))
    cache.close()
    reopened = ImageCache(tmp_path, SPEC)
    back = reopened.get("a" * 64)
    assert np.isnan(back.sums[0]) and back.sums[1:] == (0.2, 0.3)
    assert (back.brightness, back.phash, back.data) == (float("inf"), 2**64 - 1, b"x" * 50)
    assert reopened.get("b" * 64) == Stored(data=b"y" * 50, encoding="jpeg", sharpness=570.046)
    reopened.close()


def test_a_cache_entry_with_a_damaged_header_or_reason_is_never_used(tmp_path):
    """The CRC covers the header too: a flipped bit in the facts or the reason makes the
    entry missing (decoded again), and a refused file's entry is checked when scanned."""
    cache = ImageCache(tmp_path, SPEC)
    cache.put("a" * 64, Stored(data=b"x" * 50, encoding="png", source_size=(10, 12),
                               stored_size=(10, 12), sums=(1.0,), squares=(1.0,), pixels=4))
    cache.put("b" * 64, Stored(reason="not an image"))
    cache.close()
    (seg,) = cache.folder.glob("*.seg")
    blob = seg.read_bytes()
    for old, new in ((b'"source_size": [10, 12]', b'"source_size": [10, 13]'),
                     (b'"not an image"', b'"not an imagf"')):
        seg.write_bytes(blob.replace(old, new))
        damaged = ImageCache(tmp_path, SPEC)
        if b"image" in old:  # a refused entry's header: dropped from the index at once
            assert not damaged.has("b" * 64) and damaged.get("a" * 64) is not None
        else:  # a usable entry's: indexed, its bytes refused when read
            assert damaged.has("a" * 64) and damaged.get("a" * 64) is None
        damaged.close()
    seg.write_bytes(blob)
    whole = ImageCache(tmp_path, SPEC)
    assert whole.get("a" * 64).source_size == (10, 12) and whole.reason("b" * 64) == "not an image"
    whole.close()


def test_a_file_rewritten_in_place_with_its_old_mtime_is_hashed_again(tmp_path):
    """`cp -p` over an existing file: same size, same mtime, same inode; only the change
    time tells it apart."""
    import shutil
    import time

    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    a.write_bytes(b"1" * 100)
    b.write_bytes(b"2" * 100)
    for f in (a, b):
        os.utime(f, (1_700_000_000, 1_700_000_000))
    memo = HashMemo(tmp_path / "memo.sqlite")
    memo.replace([(a, stat_key(a.stat()), "a" * 64)], trust_cutoff())
    before = a.stat()
    time.sleep(0.01)  # the change time moves on (ns timestamps)
    shutil.copy2(b, a)  # what cp -p does: content, then the old times put back
    after = a.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)
    assert HashMemo(tmp_path / "memo.sqlite").get(a, stat_key(after)) is None


def test_the_trust_cutoff_is_taken_before_the_files_are_read(tmp_path):
    """A file modified just before prepare read it is not remembered, however long the
    run lasted after that."""
    f = tmp_path / "f.jpg"
    cutoff = trust_cutoff()
    f.write_bytes(b"x")
    os.utime(f, ns=(cutoff + 1, cutoff + 1))  # modified after the cut-off
    memo = HashMemo(tmp_path / "memo.sqlite")
    memo.replace([(f, stat_key(f.stat()), "a" * 64)], cutoff)
    assert HashMemo(tmp_path / "memo.sqlite").get(f, stat_key(f.stat())) is None
    os.utime(f, ns=(cutoff - 1, cutoff - 1))
    memo.replace([(f, stat_key(f.stat()), "a" * 64)], cutoff)
    assert HashMemo(tmp_path / "memo.sqlite").get(f, stat_key(f.stat())) == "a" * 64


def test_a_cache_entry_whose_hash_field_is_damaged_is_not_indexed(tmp_path):
    """What the search found: a flipped byte made an entry's sha256 no hex at all, and
    every later prepare crashed taking the cached hashes' prefixes."""
    from tfmlops.data.store import cached_prefixes

    cache = ImageCache(tmp_path, SPEC)
    good = "ab" * 32
    cache.put("cd" * 32, Stored(data=b"x" * 30, encoding="png"))
    cache.put(good, Stored(data=b"y" * 30, encoding="png"))
    cache.close()
    (seg,) = cache.folder.glob("*.seg")
    seg.write_bytes(seg.read_bytes().replace(("cd" * 32).encode(), ("cd" * 16 + "?d" + "cd" * 15).encode()))
    damaged = ImageCache(tmp_path, SPEC)
    assert set(damaged.index) == {good}
    assert len(cached_prefixes(damaged.index)) == 1
    damaged.close()


def test_a_cache_segment_removed_under_a_reader_reads_as_missing(tmp_path):
    """Another process's compaction removed a segment this run indexed (a cache shared
    by two checkouts, with no lock: an older tfmlops, or a filesystem without flock):
    its entries read as missing, decoded again, never a crash."""
    cache = ImageCache(tmp_path, SPEC)
    cache.put("a" * 64, Stored(data=b"a" * 10, encoding="png"))
    cache.close()
    reader = ImageCache(tmp_path, SPEC)
    for seg in reader.folder.glob("*.seg"):
        seg.unlink()
    assert reader.has("a" * 64) and reader.get("a" * 64) is None
    reader.close()


def test_a_run_appends_to_a_segment_of_its_own_even_one_another_run_just_made(tmp_path):
    """Two runs list the segments, both find 000002 free, one creates it: the other
    takes 000003, so neither writes at offsets the other's index does not hold."""
    cache = ImageCache(tmp_path, SPEC)
    cache.put("a" * 64, Stored(data=b"a" * 10, encoding="png"))
    cache.close()
    (first,) = cache.folder.glob("*.seg")
    before = first.read_bytes()
    seg, fd = own_segment(cache.folder, 1)  # 000001 was free when this run listed
    os.close(fd)
    assert seg.name == "000002.seg" and first.read_bytes() == before
    assert ImageCache(tmp_path, SPEC).get("a" * 64).data == b"a" * 10
