"""Label issues after `train`: the val and test images that confident learning flags as
likely mislabelled, as `reports/label_issues.csv` and a contact sheet.

The rule is confident learning (Northcutt, Jiang and Chuang, JAIR 2021), in numpy: per
class, a threshold t_j = the mean probability of class j over the images given label j;
an image counts in the confident joint at (given label, j) where j is the class whose
probability reaches its threshold (of several, the most probable); an image counted off
the diagonal is flagged, unless the model's most probable class is its given label. This
is cleanlab's `find_label_issues(labels, pred_probs, filter_by="confident_learning")`
(its tolerances included), not its default "prune_by_noise_rate", which calibrates the
joint and prunes by margin: tests/unit/test_label_issue_ranking.py checks that cleanlab
2.9 flags the same images. Flagged images are listed lowest p(given label) first (self-
confidence, cleanlab's default ranking), at most `train.label_issues` of them; an image
the rule does not flag is never listed, so the list may be empty.

Only held-out images are looked at: the model has fitted the train split's labels,
mislabelled ones included, so its probabilities there say little. The val split chose the
kept epoch and stopped the run, so its probabilities are only nearly out-of-sample (the
test split's are fully); accepted, as no weight was fitted to val's labels and cross-
validated probabilities would cost a training per fold. What is held is the
probabilities (N x classes, as the classification report's predictions); the listed
images' bytes (for the thumbnails) are read again from the TFRecords afterwards.
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfmlops.artifacts import LABEL_ISSUES_CSV, LABEL_ISSUES_PNG, read_manifest
from tfmlops.files import pyplot, write_csv, write_png

log = logging.getLogger(__name__)

COLUMNS = ("rank", "split", "file", "sha256", "given", "predicted", "p_given", "p_predicted",
           "margin")
SHEET_COLUMNS = 8  # thumbnails per row of the contact sheet
# cleanlab's FLOATING_POINT_COMPARISON: a probability this close below a threshold still
# reaches it, and p(given) this close below the top still counts as predicted as given
TOLERANCE = 1e-6
NEVER = 2.0  # the threshold of a class no image is given: above any probability


def self_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's probability of its given label."""
    return probs[np.arange(len(labels)), labels]


def margins(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p(given) minus the highest probability of any other class: below 0 when the model
    prefers another class (cleanlab's normalized margin, before its rescaling)."""
    others = probs.copy()
    others[np.arange(len(labels)), labels] = -np.inf
    return self_confidence(probs, labels) - others.max(axis=1)


def thresholds(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """t_j, the mean p(j) over the rows given label j: how sure the model usually is of a
    class's own images, so a class it is shy of needs less to count. Built as cleanlab
    builds it (float32 means stay float32 unless a class is missing), so that both
    compare the same numbers."""
    t = [probs[labels == j, j].mean() if (labels == j).any() else NEVER
         for j in range(probs.shape[1])]
    return np.clip(np.asarray(t), 2 * TOLERANCE, None)


def confident_class(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's column in the confident joint: the class whose probability reaches its
    threshold; of several, the most probable class (cleanlab's argmax over all classes,
    which the paper's argmax over the confident ones equals unless the top class misses
    its own threshold); -1 where none reaches it (not counted)."""
    confident = probs >= thresholds(probs, labels) - TOLERANCE
    reached = confident.sum(axis=1)
    guess = np.where(reached > 1, probs.argmax(axis=1), confident.argmax(axis=1))
    return np.where(reached > 0, guess, -1)


def predicted_as_given(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Rows whose most probable class is the given one, a near tie counting for it: never
    flagged, whatever the joint says (a list of the lowest p(given) held many of them)."""
    boosted = probs.copy()
    boosted[np.arange(len(labels)), labels] += TOLERANCE
    return boosted.argmax(axis=1) == labels


def flagged(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The rows confident learning flags (a boolean mask): counted off the confident
    joint's diagonal, and not predicted as given."""
    labels = np.asarray(labels, np.int64)
    if not len(labels):
        return np.zeros(0, bool)
    guess = confident_class(probs, labels)
    return (guess >= 0) & (guess != labels) & ~predicted_as_given(probs, labels)


def ranked(probs: np.ndarray, labels: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(the first `n` flagged rows, lowest p(given) first, ties in row order; how many
    rows are flagged)."""
    rows = np.flatnonzero(flagged(probs, labels))
    order = np.argsort(self_confidence(probs, np.asarray(labels, np.int64))[rows], kind="stable")
    return rows[order][:n], len(rows)


@dataclass(frozen=True)
class HeldOut:
    """The trained model's probabilities on the held-out splits, each split's rows in its
    TFRecords' file order, one split after the other."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    labels: np.ndarray  # (N,) int64
    probs: np.ndarray  # (N, classes)

    @classmethod
    def of(cls, splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> HeldOut:
        """From {split: (labels, probabilities)}."""
        parts = list(splits.values())
        return cls(tuple(splits), tuple(len(y) for y, _ in parts),
                   np.concatenate([y for y, _ in parts]).astype(np.int64),
                   np.concatenate([p for _, p in parts]))

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(labels, probabilities) of one split."""
        start = sum(self.sizes[:self.names.index(name)])
        end = start + self.sizes[self.names.index(name)]
        return self.labels[start:end], self.probs[start:end]

    def locate(self, row: int) -> tuple[str, int]:
        """(split, position in it) of a row."""
        ends = np.cumsum(self.sizes)
        i = int(np.searchsorted(ends, row, side="right"))
        return self.names[i], row - int(ends[i] - self.sizes[i])


def predict(model, prepared, split: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, probabilities as float32) of a split, batch by batch from its TFRecords in
    file order: memory for N x classes, not for the images."""
    from tfmlops.data.pipeline import predictions
    from tfmlops.data.stored_split import StoredSplit

    labels, probs = [np.zeros(0, np.int64)], [np.zeros((0, len(prepared.classes)), np.float32)]
    for (_, _, y), out in predictions(model, StoredSplit.of(prepared, split).batches(batch_size),
                                      batch_size):
        labels.append(np.asarray(y, np.int64))
        probs.append(out.astype(np.float32))
    return np.concatenate(labels), np.concatenate(probs)


@dataclass(frozen=True)
class Suspect:
    split: str
    sha256: str
    encoded: bytes  # the stored image, for its thumbnail
    given: int
    predicted: int
    p_given: float
    p_predicted: float
    margin: float


@dataclass(frozen=True)
class Found:
    """What `find` reports: how many held-out images it looked at and flagged, and the
    ones listed (at most `train.label_issues`, lowest p(given) first)."""

    looked_at: int
    flagged: int
    listed: list[Suspect]


def stored(prepared_folder: Path, held: HeldOut, rows) -> dict[int, tuple[str, bytes]]:
    """{row: (sha256, stored bytes)} of `rows`, read again from their splits' TFRecords
    (without TensorFlow): only these images' bytes are kept."""
    from tfmlops.data.stored_split import stored_records

    wanted: dict[str, dict[int, int]] = {}
    for row in rows:
        name, position = held.locate(int(row))
        wanted.setdefault(name, {})[position] = int(row)
    found: dict[int, tuple[str, bytes]] = {}
    for name, positions in wanted.items():
        start = 0
        for hashes, encoded, labels in stored_records(prepared_folder, name):
            for i in (p - start for p in positions if start <= p < start + len(hashes)):
                row = positions[start + i]
                if labels[i] != held.labels[row]:  # the records are not what was predicted
                    raise RuntimeError(f"{name} record {start + i} has label {labels[i]}, "
                                       f"predicted as label {held.labels[row]}")
                found[row] = (hashes[i], encoded[i])
            start += len(hashes)
    return found


def find(held: HeldOut, listed: int, prepared_folder: Path) -> Found:
    """The flagged images, the first `listed` of them with their stored bytes."""
    rows, count = ranked(held.probs, held.labels, listed)
    images = stored(prepared_folder, held, rows)
    probs, given = held.probs[rows].astype(np.float64), held.labels[rows]
    predicted, margin = probs.argmax(axis=1), margins(probs, given)
    suspects = [Suspect(held.locate(int(r))[0], *images[int(r)], int(given[i]),
                        int(predicted[i]), float(probs[i, given[i]]),
                        float(probs[i, predicted[i]]), float(margin[i]))
                for i, r in enumerate(rows)]
    return Found(len(held.labels), count, suspects)


def rows(suspects: list[Suspect], classes: list[str], prepared_folder: Path) -> list[dict]:
    """The CSV's rows; `file` from prepare's manifest (several files of one content and
    label in one split are joined with '; ')."""
    wanted = {s.sha256 for s in suspects}
    files: dict[tuple[str, str, str], list[str]] = {}
    for f in read_manifest(prepared_folder)["files"]:
        if f["sha256"] in wanted:
            files.setdefault((f["sha256"], f["label"], f["split"]), []).append(f["file"])
    return [{"rank": r, "split": s.split, "sha256": s.sha256,
             "file": "; ".join(files.get((s.sha256, classes[s.given], s.split), [])),
             "given": classes[s.given], "predicted": classes[s.predicted],
             "p_given": round(s.p_given, 6), "p_predicted": round(s.p_predicted, 6),
             "margin": round(s.margin, 6)} for r, s in enumerate(suspects, start=1)]


def contact_sheet(suspects: list[Suspect], classes: list[str], empty: str, path: Path) -> None:
    """A grid of thumbnails, each titled with its given and predicted label (`empty`
    written instead when there are none), written atomically."""
    from PIL import Image

    plt = pyplot()
    cols = max(min(SHEET_COLUMNS, len(suspects)), 1)
    lines = max(math.ceil(len(suspects) / cols), 1)
    fig, axes = plt.subplots(lines, cols, figsize=(1.9 * cols, 2.4 * lines), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    if not suspects:  # still written: DVC expects the plot
        axes[0, 0].text(0.5, 0.5, empty, ha="center", va="center")
    for ax, (r, s) in zip(axes.flat, enumerate(suspects, start=1), strict=False):
        pixels = np.asarray(Image.open(io.BytesIO(s.encoded)))  # prepare stores L or RGB
        ax.imshow(pixels, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(f"{r}. given {classes[s.given]} /\npredicted {classes[s.predicted]} "
                     f"({s.p_predicted:.2f})", fontsize=7)
    fig.tight_layout(h_pad=1.5)
    write_png(path, fig, dpi=100)


def write(found: Found | None, classes: list[str], prepared_folder: Path,
          reports: Path) -> list[Path]:
    """reports/label_issues.csv and reports/label_issues.png (only a header and a note
    when nothing is flagged, or `found` is None: `train.label_issues` is 0); returns both."""
    listed = found.listed if found is not None else []
    csv = write_csv(Path(reports) / LABEL_ISSUES_CSV, rows(listed, classes, prepared_folder),
                    COLUMNS)
    sheet = Path(reports) / LABEL_ISSUES_PNG
    contact_sheet(listed, classes, "no label issues\nflagged" if found is not None else
                  "label issues off\n(train.label_issues: 0)", sheet)
    if found is not None:
        log.info(f"train: confident learning flags {found.flagged or 'none'} of the "
                 f"{found.looked_at} val and test images as likely mislabelled; "
                 f"{len(listed)} listed (lowest p(given label) first) -> {csv}")
    return [csv, sheet]
