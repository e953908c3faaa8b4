"""The data profile: per split and class, counts and fixed-bin histograms of each
image's facts, folded in as prepare writes (`data.stream.fold`), one image at a time.

The bin edges are constants, not fitted to the data, so two profiles (this run's and
a reference's, `data.drift`) compare bin by bin. Bin i counts values v with
edges[i-1] <= v < edges[i]: the first and last bins hold what falls outside the
edges. Memory stays flat in the number of images: the histograms are small, and the
perceptual hashes the leakage search needs take 8 bytes per image.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter
from pathlib import Path

from tfmlops.files import write_csv
from tfmlops.stages.prepare.images import SPLITS

CLASSES_COLUMNS = ("class", *SPLITS)  # data_profile_classes.csv
FEATURES_COLUMNS = ("bin", *SPLITS)  # data_profile_features.csv


def _steps(start: float, stop: float, step: float) -> list[float]:
    return [round(start + i * step, 6) for i in range(round((stop - start) / step) + 1)]


def _powers(lo: float, hi: float, step: float) -> list[float]:
    return [round(2 ** e, 4) for e in _steps(lo, hi, step)]


# Fixed bin edges per numeric feature. Sizes and bytes by half powers of two; sharpness
# (variance of the Laplacian) by powers of two too, up to what 8-bit edges give.
EDGES: dict[str, list[float]] = {
    "width": _powers(3, 14, 0.5),  # 8 .. 16384 px, of the source (upright)
    "height": _powers(3, 14, 0.5),
    "aspect_ratio": _powers(-2, 2, 0.25),  # width / height, 1/4 .. 4
    "bytes": _powers(6, 26, 0.5),  # 64 B .. 64 MiB, of the source file
    "brightness": _steps(0.05, 0.95, 0.05),  # mean grey level / 255, of the stored image
    "contrast": _steps(0.025, 0.475, 0.025),  # standard deviation of grey / 255
    "saturation": _steps(0.05, 0.95, 0.05),  # mean HSV saturation / 255 (0: grey)
    "sharpness": _powers(0, 22, 1),  # variance of the Laplacian of grey
}
CATEGORIES = ("format", "channels")  # counted by value


def image_facts(stored) -> dict:
    """A stored image's (`data.store.Stored`) profiled facts, by feature name."""
    width, height = stored.source_size
    return {"width": width, "height": height, "aspect_ratio": width / max(height, 1),
            "bytes": stored.source_bytes, "brightness": stored.brightness,
            "contrast": stored.contrast, "saturation": stored.saturation,
            "sharpness": stored.sharpness, "format": stored.source_format,
            "channels": str(stored.source_channels)}


class Profile:
    """Counts and histograms per (split, class), and the pHashes in the order added."""

    def __init__(self, tiny_side: int, keep_hashes: bool = True):
        self.tiny_side = tiny_side
        self.keep_hashes = keep_hashes  # Beam's combiners keep none: leakage runs on a worker
        self.counts: Counter = Counter()  # (split, class) -> images
        self.hists: dict = {}  # (split, class) -> {feature: [counts per bin]}
        self.cats: dict = {}  # (split, class) -> {feature: Counter}
        self.tiny = 0  # images whose source short side is below tiny_side
        self.phashes = array("Q")
        self.split_index = array("b")

    def add(self, stored, label: str, split: str) -> None:
        key = (split, label)
        self.counts[key] += 1
        if key not in self.hists:
            self.hists[key] = {f: [0] * (len(e) + 1) for f, e in EDGES.items()}
            self.cats[key] = {f: Counter() for f in CATEGORIES}
        hists, cats, facts = self.hists[key], self.cats[key], image_facts(stored)
        for feature, edges in EDGES.items():
            hists[feature][bisect_right(edges, facts[feature])] += 1
        for feature in CATEGORIES:
            cats[feature][facts[feature]] += 1
        self.tiny += min(stored.source_size) < self.tiny_side
        if self.keep_hashes:
            self.phashes.append(stored.phash)
            self.split_index.append(SPLITS.index(split))

    def merge(self, other: Profile) -> None:
        """Fold `other`'s counts in (Beam's combiners; hashes are not kept there)."""
        self.counts.update(other.counts)
        self.tiny += other.tiny
        for key, hists in other.hists.items():
            if key not in self.hists:
                self.hists[key] = {f: [0] * len(h) for f, h in hists.items()}
                self.cats[key] = {f: Counter() for f in CATEGORIES}
            for feature, counts in hists.items():
                self.hists[key][feature] = [a + b for a, b in
                                            zip(self.hists[key][feature], counts, strict=True)]
            for feature, counter in other.cats[key].items():
                self.cats[key][feature].update(counter)

    def summary(self, classes: list[str]) -> dict:
        """The profile as data_profile.json holds it (no hashes, no files)."""
        total = sum(self.counts.values())
        keys = [(s, c) for s in SPLITS for c in classes if (s, c) in self.hists]
        return {
            "images": total,
            "classes": classes,
            "counts": {s: {c: self.counts[(s, c)] for c in classes} for s in SPLITS},
            "class_share": {c: sum(self.counts[(s, c)] for s in SPLITS) / max(total, 1)
                            for c in classes},
            "tiny": {"side": self.tiny_side, "images": self.tiny,
                     "share": self.tiny / max(total, 1)},
            "edges": EDGES,
            "features": {f: _summed([self.hists[k][f] for k in keys]) for f in EDGES}
            | {f: _merged([self.cats[k][f] for k in keys]) for f in CATEGORIES},
            "by_split_class": {s: {c: {**self.hists[(s, c)],
                                       **{f: dict(sorted(v.items()))
                                          for f, v in self.cats[(s, c)].items()}}
                                   for c in classes if (s, c) in self.hists} for s in SPLITS},
        }


def _summed(lists: list[list[int]]) -> list[int]:
    return [sum(col) for col in zip(*lists, strict=True)] if lists else []


def _merged(counters: list[Counter]) -> dict:
    return dict(sorted(sum(counters, Counter()).items()))


def split_histograms(summary: dict, feature: str) -> tuple[list[str], dict[str, list[int]]]:
    """(bin names, {split: count per bin}) of `feature` over each split's classes, from a
    profile summary: a numeric feature's `bin_labels`, a category's values seen (sorted)."""
    per_split = {s: [h[feature] for h in summary["by_split_class"][s].values()] for s in SPLITS}
    if feature not in CATEGORIES:
        empty = [0] * (len(EDGES[feature]) + 1)
        return bin_labels(feature), {s: _summed(v) or empty for s, v in per_split.items()}
    out = {s: _merged([Counter(h) for h in v]) for s, v in per_split.items()}
    names = sorted({n for h in out.values() for n in h})
    return names, {s: [out[s].get(n, 0) for n in names] for s in SPLITS}


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def bin_labels(feature: str) -> list[str]:
    """`lo-hi` of each bin of a numeric feature, `<lo` and `>=hi` at the ends."""
    edges = [_num(e) for e in EDGES[feature]]
    return [f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:], strict=False)] \
        + [f">={edges[-1]}"]


def write_csvs(summary: dict, classes_csv: Path, features_csv: Path) -> None:
    """The plots dvc shows: images per class and split; every feature's histogram per
    split, one row per (feature, bin), bins named `feature lo-hi`."""
    write_csv(classes_csv, ({"class": c, **{s: summary["counts"][s][c] for s in SPLITS}}
                            for c in summary["classes"]), CLASSES_COLUMNS)
    rows = []
    for feature in [*EDGES, *CATEGORIES]:
        names, hists = split_histograms(summary, feature)
        rows += [{"bin": f"{feature} {n}", **{s: hists[s][i] for s in SPLITS}}
                 for i, n in enumerate(names)]
    write_csv(features_csv, rows, FEATURES_COLUMNS)
