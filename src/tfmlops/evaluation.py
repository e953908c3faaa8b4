"""The figures promote's gate reads, as pure functions of small per-image arrays.

A version's evaluation is three arrays over the same images: the true class, the
predicted class (an index into the current split's classes, -1 for a class name
the version's model does not share with the split: always wrong) and the
confidence (its top probability). No TensorFlow, no MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tfmlops.files import pyplot, write_png

ECE_BINS = 15  # equal-width confidence bins
UNKNOWN = "unknown"  # a slice key the manifest does not give (an older prepare)
# Source-size buckets, by the longer side in pixels: (upper bound, name).
SIZE_BUCKETS = ((64, "<64px"), (256, "64-255px"), (1024, "256-1023px"), (4096, "1024-4095px"),
                (float("inf"), ">=4096px"))


def confusion(labels: np.ndarray, predicted: np.ndarray, k: int) -> np.ndarray:
    """k x (k+1) counts: row = true class, column = predicted class; the last column
    counts predictions of a class the split does not know (predicted == -1)."""
    cols = np.where(predicted < 0, k, predicted)
    out = np.zeros((k, k + 1), np.int64)
    np.add.at(out, (labels, cols), 1)
    return out


def per_class(matrix: np.ndarray, classes: Sequence[str]) -> dict[str, dict]:
    """{class: precision, recall, f1, support} from a confusion matrix; recall is None
    for a class with no image here, precision 0 for one never predicted."""
    out = {}
    for j, name in enumerate(classes):
        hit, support, predicted = int(matrix[j, j]), int(matrix[j].sum()), int(matrix[:, j].sum())
        precision = hit / predicted if predicted else 0.0
        # 2pr / (p + r) from the counts, as scikit-learn computes it: one division, so a
        # tie at the 7th decimal rounds as the exact ratio does.
        f1 = 2 * hit / (support + predicted) if hit else 0.0
        out[name] = {"precision": round(precision, 6), "recall": round(hit / support, 6) if support else None,
                     "f1": round(f1, 6), "support": support}
    return out


def calibration(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """Expected calibration error over ECE_BINS equal-width bins, and the bins it draws on."""
    conf = np.clip(np.asarray(confidence, np.float64), 0.0, 1.0)
    correct = np.asarray(correct, bool)
    which = np.minimum((conf * ECE_BINS).astype(int), ECE_BINS - 1)
    rows, ece = [], 0.0
    for b in range(ECE_BINS):
        inside = which == b
        count = int(inside.sum())
        mean_conf = float(conf[inside].mean()) if count else None
        acc = float(correct[inside].mean()) if count else None
        if count:
            ece += count / len(conf) * abs(acc - mean_conf)
        rows.append({"low": b / ECE_BINS, "high": (b + 1) / ECE_BINS, "count": count,
                     "confidence": mean_conf, "accuracy": acc})
    return {"ece": round(ece, 6), "bins": rows}


def summarize(labels: np.ndarray, predicted: np.ndarray, confidence: np.ndarray,
              classes: Sequence[str]) -> dict:
    """One version's figures on the images given."""
    correct = predicted == labels
    matrix = confusion(labels, predicted, len(classes))
    return {"images": int(len(labels)),
            "accuracy": round(float(correct.mean()), 6) if len(labels) else None,
            "per_class": per_class(matrix, classes),
            "confusion": {"rows": list(classes), "columns": [*classes, UNKNOWN], "counts": matrix.tolist()},
            **calibration(confidence, correct)}


def paired_interval(candidate_correct: np.ndarray, production_correct: np.ndarray, confidence: float) -> dict:
    """The accuracy difference candidate - production on the same n images, (b - c) / n,
    with an exact interval at `confidence`: b (only the candidate right) given b + c
    discordant images is binomial, so the Clopper-Pearson interval of b / (b + c),
    mapped through d = (2p - 1)(b + c) / n, bounds the difference. No discordant image:
    the difference is 0 and so is its interval."""
    from scipy.stats import beta

    cand, prod = np.asarray(candidate_correct, bool), np.asarray(production_correct, bool)
    n = len(cand)
    b, c = int(np.sum(cand & ~prod)), int(np.sum(~cand & prod))
    alpha = 1.0 - confidence
    low_p = float(beta.ppf(alpha / 2, b, c + 1)) if b > 0 else 0.0
    high_p = float(beta.ppf(1 - alpha / 2, b + 1, c)) if c > 0 else 1.0
    scale = (b + c) / n if n else 0.0
    low, high = (2 * low_p - 1) * scale, (2 * high_p - 1) * scale
    return {"images": n, "candidate_only": b, "production_only": c,
            "difference": (b - c) / n if n else 0.0, "low": low, "high": high,
            "confidence": confidence, "method": "exact McNemar (Clopper-Pearson on b/(b+c))"}


def monotone_low(b: int, c: int, n: int, confidence: float) -> float:
    """The paired interval's lower bound, made monotone in b: the best lower bound of b'
    candidate-only images for any b' <= b. The exact interval alone is not: with n = 269,
    b=0, c=2 gives -2/n but b=1, c=2 (one more image right) gives -2.95/n, so a strictly
    better candidate could fail a margin the worse one passes."""
    from scipy.stats import beta

    if n == 0:
        return 0.0
    alpha = 1.0 - confidence
    bs = np.arange(b + 1)
    low_p = np.where(bs > 0, beta.ppf(alpha / 2, np.maximum(bs, 1), c + 1), 0.0)
    lows = np.where(bs + c > 0, (2 * low_p - 1) * (bs + c) / n, 0.0)
    return float(lows.max())


def size_bucket(width, height) -> str:
    """The source-size bucket of an image by its longer side; UNKNOWN without sizes."""
    try:
        side = max(int(width), int(height))
    except (TypeError, ValueError):
        return UNKNOWN
    return next(name for bound, name in SIZE_BUCKETS if side < bound)


def slices(keys: Mapping[str, Sequence[str]], correct: Mapping[str, np.ndarray]) -> dict:
    """{slice kind: {key: {"images": n, <version>: accuracy, ...}}} for each kind of key
    (one key per image) and each version's per-image correctness."""
    out: dict[str, dict] = {}
    for kind, per_image in keys.items():
        per_image = np.asarray(per_image, dtype=object)
        groups = {}
        for key in sorted(set(per_image.tolist())):
            inside = per_image == key
            groups[str(key)] = {"images": int(inside.sum()),
                                **{v: round(float(ok[inside].mean()), 6) for v, ok in correct.items()}}
        out[kind] = groups
    return out


def reliability_png(bins_by_version: Mapping[str, dict], path: Path) -> Path:
    """Accuracy against confidence per bin, one line per version, the diagonal for
    reference: where a model's line runs below it, it is overconfident."""
    fig, ax = pyplot().subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="calibrated")
    for version, cal in bins_by_version.items():
        used = [b for b in cal["bins"] if b["count"]]
        ax.plot([b["confidence"] for b in used], [b["accuracy"] for b in used], marker="o",
                label=f"{version} (ECE {cal['ece']:.3f})")
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.02),
           title="reliability on the current test split")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return write_png(path, fig, dpi=100)


def confusion_png(counts, rows: list[str], columns: list[str], title: str, path: Path) -> Path:
    """A confusion matrix (rows: true class) as a PNG, each non-zero count written in."""
    counts = np.asarray(counts)
    size = 3 + 0.35 * len(columns)
    fig, ax = pyplot().subplots(figsize=(size, size))
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(columns)), columns, rotation=90)
    ax.set_yticks(range(len(rows)), rows)
    for (i, j), n in np.ndenumerate(counts):
        if n:
            ax.text(j, i, str(n), ha="center", va="center", fontsize=7)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    return write_png(path, fig, dpi=100)
