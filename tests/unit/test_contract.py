"""The data contract's pure parts: the perceptual hash, the near-duplicate search
(against all pairs), the Jensen-Shannon distance and the profile's fixed bins."""

import io
import itertools

import numpy as np
from PIL import Image

from tfmlops.data.features import image_features, phash
from tfmlops.stages.prepare.data_profile import EDGES
from tfmlops.stages.prepare.drift import js_distance
from tfmlops.stages.prepare.leakage import chunks, find_leakage


def test_phash_keeps_a_resized_recompressed_copy_close_and_unrelated_images_far():
    rng = np.random.default_rng(0)
    import cv2

    def blobs():
        return cv2.resize(rng.uniform(0, 255, (5, 5)).astype(np.float32), (96, 80),
                          interpolation=cv2.INTER_CUBIC).clip(0, 255).astype(np.uint8)

    images = [blobs() for _ in range(20)]
    hashes = [phash(g) for g in images]
    for grey, h in zip(images, hashes, strict=True):
        buf = io.BytesIO()
        Image.fromarray(grey).resize((72, 60)).save(buf, format="JPEG", quality=70)
        copy = np.asarray(Image.open(buf))
        assert bin(h ^ phash(copy)).count("1") <= 4
    assert min(bin(a ^ b).count("1") for a, b in itertools.combinations(hashes, 2)) > 8
    assert all(0 <= h < 2**64 for h in hashes)


def test_image_features_of_flat_and_busy_images():
    flat = image_features(np.full((40, 50, 3), (200, 40, 40), np.uint8))
    assert flat["contrast"] == 0 and flat["sharpness"] == 0 and flat["saturation"] > 0.7
    busy = image_features(np.random.default_rng(1).integers(0, 256, (40, 50), np.uint8))
    assert busy["saturation"] == 0 and busy["sharpness"] > 1000 and 0.4 < busy["brightness"] < 0.6


def test_near_duplicate_search_finds_what_all_pairs_finds():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, distance = int(rng.integers(2, 200)), int(rng.integers(0, 9))
        base = rng.integers(0, 2**63, max(1, n // 4), dtype=np.uint64) * np.uint64(2)
        hashes = base[rng.integers(0, len(base), n)]
        for _ in range(3):  # flip a random bit in about half the hashes
            flip = rng.random(n) < 0.5
            hashes[flip] ^= np.uint64(1) << rng.integers(0, 64, flip.sum()).astype(np.uint64)
        splits = rng.integers(0, 3, n)
        found = find_leakage(hashes, splits, distance, limit=10**6)
        bits = np.bitwise_count(hashes[:, None] ^ hashes[None, :])
        near = (bits <= distance) & (splits[:, None] != splits[None, :])
        assert found.pairs == np.triu(near, 1).sum() == len(found.listed)
        assert found.leaked == (near.any(1) & (splits > 0)).sum()
        expected = set(zip(*np.nonzero(np.triu(near, 1)), strict=True))
        assert {(min(i, j), max(i, j)) for i, j, _ in found.listed} == expected
        few = find_leakage(hashes, splits, distance, limit=2)  # closest first, all across splits
        assert len(few.listed) == min(2, found.pairs)
        assert [d for _, _, d in few.listed] == sorted(d for _, _, d in found.listed)[:2]


def test_the_listed_pairs_skip_near_pairs_within_one_split():
    """The closest near pair sits in one split: the one listed is the pair across splits."""
    found = find_leakage(np.array([0, 1, 0xFF00, 0xFF03], np.uint64), [0, 0, 0, 1], 4, limit=1)
    assert found.pairs == 1 and found.listed == [(2, 3, 2)]


def test_many_identical_hashes_are_counted_without_listing_them_all():
    splits = np.arange(30_000) % 3
    found = find_leakage(np.zeros(30_000, np.uint64), splits, 4, limit=5)
    assert found.pairs == 3 * 10_000 * 10_000 and found.leaked == 20_000
    assert len(found.listed) == 5


def test_chunks_cover_the_64_bits_once():
    for distance in range(9):
        parts = chunks(distance)
        bits = [b for start, n in parts for b in range(start, start + n)]
        assert len(parts) == distance + 1 and sorted(bits) == list(range(64))  # each bit once


def test_js_distance_is_zero_for_the_same_shape_and_one_for_disjoint():
    assert js_distance([1, 2, 3], [10, 20, 30]) == 0
    assert abs(js_distance([5, 0], [0, 5]) - 1) < 1e-12
    assert 0 < js_distance([5, 5], [6, 4]) < 0.1
    assert all(a < b for edges in EDGES.values() for a, b in itertools.pairwise(edges))


def summary(classes, tiny_share=0.0, side=32, formats=None, brightness=None, stored=None):
    """A data_profile.json's parts the anomalies read."""
    share = {c: 1 / len(classes) for c in classes} if isinstance(classes, list) else classes
    bins = len(EDGES["brightness"]) + 1
    return {"classes": list(share), "class_share": share,
            "tiny": {"side": side, "share": tiny_share}, "edges": EDGES,
            "stored": stored or {"short_side": 32, "channels": 1},
            "features": {"format": formats or {"PNG": 10},
                         "brightness": brightness or [1] * bins}}


def test_each_anomaly_is_raised_by_its_change_and_not_by_a_change_of_settings():
    from types import SimpleNamespace

    from tfmlops.stages.prepare.drift import anomalies

    contract = SimpleNamespace(max_class_share_change=0.05, max_feature_distance=0.15,
                               tiny=SimpleNamespace(max_share_change=0.02))
    ref = summary(["a", "b"])
    kinds = lambda now: [a["kind"] for a in anomalies(now, ref, contract)]  # noqa: E731
    assert kinds(summary(["a", "b"])) == []
    assert kinds(summary({"a": 0.7, "b": 0.3})) == ["class_share", "class_share"]
    assert kinds(summary(["a", "b"], formats={"PNG": 5, "JPEG": 5})) == ["new_format"]
    assert kinds(summary(["a", "b"], tiny_share=0.1)) == ["tiny_images"]
    dark = [10] + [0] * (len(EDGES["brightness"]))
    assert kinds(summary(["a", "b"], brightness=dark)) == ["feature_drift"]
    # the same changes under other settings are not the data's: nothing to compare
    assert kinds(summary(["a", "b"], tiny_share=0.1, side=64)) == []
    assert kinds(summary(["a", "b"], brightness=dark, stored={"short_side": 64,
                                                              "channels": 1})) == []
