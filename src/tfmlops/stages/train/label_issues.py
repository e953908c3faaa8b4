"""Suspected label errors after `train`: the val and test images whose given label the
trained model finds least likely, as `reports/label_issues.csv` and a contact sheet.

The ranking is cleanlab's default one (self-confidence: the model's probability of the
given label, lowest first), computed here without cleanlab. Only held-out images are
ranked: the model has fitted the train split's labels, mislabelled ones included, so its
probabilities there say little. The splits stream through batch by batch; what is kept is
the worst `train.label_issues` images with their stored bytes (for the thumbnails), so
memory does not grow with the split.
"""

from __future__ import annotations

import heapq
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


def self_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's probability of its given label."""
    return probs[np.arange(len(labels)), labels]


def margins(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """p(given) minus the highest probability of any other class: below 0 when the model
    prefers another class (cleanlab's normalized margin, before its rescaling)."""
    others = probs.copy()
    others[np.arange(len(labels)), labels] = -np.inf
    return self_confidence(probs, labels) - others.max(axis=1)


def rank(p_given: np.ndarray, n: int) -> np.ndarray:
    """Indices of the `n` rows with the lowest p_given, lowest first; ties keep row order."""
    return np.argsort(p_given, kind="stable")[:n]


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


class Worst:
    """The `n` images with the lowest p_given over every batch added: a bounded heap, the
    same result as `rank` over all batches at once (ties: the earlier image first)."""

    def __init__(self, n: int):
        self.n = n
        self._heap: list[tuple[float, int, Suspect]] = []  # (-p_given, -order, suspect)
        self._seen = 0

    def add(self, split: str, hashes: list[str], encoded: list[bytes], probs: np.ndarray,
            labels: np.ndarray) -> None:
        labels = np.asarray(labels, np.int64)
        p_given, margin = self_confidence(probs, labels), margins(probs, labels)
        predicted = probs.argmax(axis=1)
        for i in rank(p_given, self.n):  # no other row of the batch can enter
            item = (-float(p_given[i]), -(self._seen + int(i)), Suspect(
                split, hashes[i], encoded[i], int(labels[i]), int(predicted[i]),
                float(p_given[i]), float(probs[i, predicted[i]]), float(margin[i])))
            if len(self._heap) < self.n:
                heapq.heappush(self._heap, item)
            elif item[:2] > self._heap[0][:2]:
                heapq.heapreplace(self._heap, item)
            else:
                break  # the batch's next rows are no lower
        self._seen += len(labels)

    def suspects(self) -> list[Suspect]:
        """Lowest p_given first."""
        return [s for _, _, s in sorted(self._heap, key=lambda t: t[:2], reverse=True)]


def scan(model, split, name: str, batch_size: int, worst: Worst):
    """(labels, predicted classes) of a `StoredSplit`, its images added to `worst`."""
    from tfmlops.data.pipeline import predictions

    labels, predicted = [], []
    for (hashes, encoded, _, y), out in predictions(model, split.hashed_batches(batch_size),
                                                    batch_size):
        probs = out.astype(np.float64)
        if worst.n:
            worst.add(name, hashes, encoded, probs, y)
        labels.append(y)
        predicted.append(probs.argmax(axis=1))
    return np.concatenate(labels), np.concatenate(predicted)


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


def contact_sheet(suspects: list[Suspect], classes: list[str], path: Path) -> None:
    """A grid of thumbnails, each titled with its given and predicted label, written
    atomically."""
    from PIL import Image

    plt = pyplot()
    cols = max(min(SHEET_COLUMNS, len(suspects)), 1)
    lines = max(math.ceil(len(suspects) / cols), 1)
    fig, axes = plt.subplots(lines, cols, figsize=(1.9 * cols, 2.4 * lines), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    if not suspects:  # still written: DVC expects the plot (train.label_issues: 0)
        axes[0, 0].text(0.5, 0.5, "no suspected\nlabel errors", ha="center", va="center")
    for ax, (r, s) in zip(axes.flat, enumerate(suspects, start=1), strict=False):
        pixels = np.asarray(Image.open(io.BytesIO(s.encoded)))  # prepare stores L or RGB
        ax.imshow(pixels, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(f"{r}. given {classes[s.given]} /\npredicted {classes[s.predicted]} "
                     f"({s.p_predicted:.2f})", fontsize=7)
    fig.tight_layout(h_pad=1.5)
    write_png(path, fig, dpi=100)


def write(worst: Worst, classes: list[str], prepared_folder: Path, reports: Path) -> list[Path]:
    """reports/label_issues.csv and reports/label_issues.png (only a header and a note
    when `train.label_issues` is 0); returns both."""
    suspects = worst.suspects()
    csv = write_csv(Path(reports) / LABEL_ISSUES_CSV, rows(suspects, classes, prepared_folder),
                    COLUMNS)
    sheet = Path(reports) / LABEL_ISSUES_PNG
    contact_sheet(suspects, classes, sheet)
    log.info(f"train: {len(suspects)} suspected label errors in val and test (lowest "
             f"p(given label) first) -> {csv}")
    return [csv, sheet]
