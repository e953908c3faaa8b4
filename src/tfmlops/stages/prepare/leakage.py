"""Near-duplicates across splits: images whose perceptual hashes (data.features.phash)
differ in at most `max_distance` bits, one in a split and one in another.

The search is not all pairs. Identical hashes are grouped first (a thousand blank
images are one hash). Among the distinct hashes, multi-index hashing: the 64 bits are
cut into max_distance + 1 chunks; by pigeonhole, two hashes within the distance agree
exactly on at least one chunk, so only hashes sharing a chunk's value are compared
(sorted by that chunk, compared with their neighbours at offset 1, 2, ... while any
neighbours still share it; numpy throughout). A pair found in several chunks is kept
in its first. Exact duplicates (the same bytes) never cross splits
(`images.assign_splits`); the same hash from other bytes can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfmlops.stages.prepare.images import SPLITS


@dataclass
class Leakage:
    pairs: int  # image pairs in different splits within the distance
    leaked: int  # val and test images with a near-duplicate in another split
    held_out: int  # val and test images
    listed: list  # up to `limit` pairs: (image index, image index, distance)

    @property
    def share(self) -> float:
        return self.leaked / max(self.held_out, 1)


def chunks(max_distance: int) -> list[tuple[int, int]]:
    """(shift, bits) of the max_distance + 1 chunks of a 64-bit hash, near-equal sizes."""
    count = max_distance + 1
    sizes = [64 // count + (i < 64 % count) for i in range(count)]
    shifts = np.cumsum([0, *sizes[:-1]])
    return [(int(s), n) for s, n in zip(shifts, sizes, strict=True)]


def _chunk(values: np.ndarray, shift: int, bits: int) -> np.ndarray:
    return (values >> np.uint64(shift)) & np.uint64((1 << bits) - 1)


def near_hash_pairs(hashes: np.ndarray, max_distance: int):
    """(a, b, distance) arrays of index pairs a < b of distinct uint64 `hashes` whose
    Hamming distance is at most `max_distance`."""
    parts = chunks(max_distance)
    found_a, found_b = [], []
    for k, (shift, bits) in enumerate(parts):
        key = _chunk(hashes, shift, bits)
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        for offset in range(1, len(hashes)):
            same = ordered[offset:] == ordered[:-offset]
            if not same.any():
                break  # no run of equal chunks is longer than offset
            a, b = order[:-offset][same], order[offset:][same]
            near = np.bitwise_count(hashes[a] ^ hashes[b]) <= max_distance
            for s, n in parts[:k]:  # found in an earlier chunk already
                near &= _chunk(hashes[a], s, n) != _chunk(hashes[b], s, n)
            found_a.append(np.minimum(a, b)[near])
            found_b.append(np.maximum(a, b)[near])
    a = np.concatenate(found_a) if found_a else np.zeros(0, np.int64)
    b = np.concatenate(found_b) if found_b else np.zeros(0, np.int64)
    return a, b, np.bitwise_count(hashes[a] ^ hashes[b]).astype(np.int64)


def find_leakage(phashes, split_index, max_distance: int, limit: int = 100) -> Leakage:
    """Near-duplicate image pairs across splits. `phashes` and `split_index` (0 train,
    1 val, 2 test) are per image; `listed` holds up to `limit` pairs, closest first."""
    hashes = np.asarray(phashes, dtype=np.uint64)
    splits = np.asarray(split_index, dtype=np.int64)
    unique, inverse = np.unique(hashes, return_inverse=True)
    counts = np.zeros((len(unique), len(SPLITS)), np.int64)  # images per hash and split
    np.add.at(counts, (inverse, splits), 1)
    ua, ub, dist = near_hash_pairs(unique, max_distance)
    self_pairs = np.nonzero((counts > 0).sum(1) > 1)[0]  # one hash in several splits
    ua, ub = np.concatenate([self_pairs, ua]), np.concatenate([self_pairs, ub])
    dist = np.concatenate([np.zeros(len(self_pairs), np.int64), dist])
    cross = counts[ua][:, :, None] * counts[ub][:, None, :]  # [pair, split a, split b]
    cross[:, np.arange(len(SPLITS)), np.arange(len(SPLITS))] = 0
    total = np.where(ua == ub, cross.sum((1, 2)) // 2, cross.sum((1, 2)))
    # near pairs whose images all sit in one split are not leakage: not listed either
    ua, ub, dist, total = (a[total > 0] for a in (ua, ub, dist, total))
    # A hash's neighbourhood: the splits of every hash within the distance, its own too.
    present = (counts > 0) @ (1 << np.arange(len(SPLITS)))
    near = present.copy()
    np.bitwise_or.at(near, ua, present[ub])
    np.bitwise_or.at(near, ub, present[ua])
    mine = 1 << splits
    leaked = (splits > 0) & ((near[inverse] & ~mine) != 0)
    order = np.lexsort((ub, ua, dist))[: limit]
    return Leakage(int(total.sum()), int(leaked.sum()), int((splits > 0).sum()),
                   _listed(ua[order], ub[order], dist[order], inverse, splits, limit))


def _listed(ua, ub, dist, inverse, splits, limit: int) -> list:
    """Image pairs of the hash pairs (in their order), in different splits, up to `limit`."""
    members = {int(u): [] for u in np.concatenate([ua, ub])}
    for i in np.nonzero(np.isin(inverse, list(members)))[0]:
        members[int(inverse[i])].append(int(i))
    out = []
    for u, v, d in zip(ua.tolist(), ub.tolist(), dist.tolist(), strict=True):
        for i in members[u]:
            for j in members[v]:
                if (u != v or i < j) and splits[i] != splits[j]:
                    out.append((i, j, d))
                    if len(out) >= limit:
                        return out
    return out
