"""The data profile as one PNG for the `prepare` run in MLflow: images per class and
split, and every feature's histogram per split (as shares of the split, so splits of
different sizes overlay), one small panel each.

Drawn with Pillow, which prepare has loaded already, not matplotlib: importing and
drawing a matplotlib figure of these panels cost prepare more than the 10% the whole
contract may (BENCHMARKS.md, "Prepare": the data contract rows); these lines and labels
take milliseconds. `dvc plots show` draws the same numbers from the CSVs.
"""

from __future__ import annotations

from pathlib import Path

from tfmlops.artifacts import DATA_PROFILE_PNG
from tfmlops.stages.prepare.data_profile import CATEGORIES, EDGES, split_histograms
from tfmlops.stages.prepare.images import SPLITS

PANEL = (320, 180)  # width, height of one panel, in pixels
COLUMNS = 4
COLOURS = {"train": (31, 119, 180), "val": (255, 127, 14), "test": (44, 160, 44)}


def panels(summary: dict) -> list[tuple[str, list[str], dict[str, list[float]]]]:
    """(title, bin labels, {split: shares}) of each panel: class counts, then features."""
    classes = summary["classes"]
    out = [("images per class (share of split)", classes,
            {s: _shares([summary["counts"][s][c] for c in classes]) for s in SPLITS})]
    for feature in [*EDGES, *CATEGORIES]:
        labels, hists = split_histograms(summary, feature)
        out.append((f"{feature} (share of split)", labels, {s: _shares(hists[s]) for s in SPLITS}))
    return out


def _shares(values: list[int]) -> list[float]:
    total = max(sum(values), 1)
    return [v / total for v in values]


def draw_profile(profile_json: Path, folder: Path) -> Path:
    """The profile file `profile_json` drawn into `folder` (run.log_drawn)."""
    import json

    from PIL import Image, ImageDraw

    items = panels(json.loads(Path(profile_json).read_text()))
    rows = -(-len(items) // COLUMNS)
    img = Image.new("RGB", (PANEL[0] * COLUMNS, PANEL[1] * rows), "white")
    draw = ImageDraw.Draw(img)
    for k, (title, labels, series) in enumerate(items):
        _panel(draw, (k % COLUMNS) * PANEL[0], (k // COLUMNS) * PANEL[1], title, labels, series)
    x = img.width - 150
    for split, colour in COLOURS.items():  # the legend, bottom right
        draw.text((x, img.height - 16), split, fill=colour)
        x += 45
    path = folder / DATA_PROFILE_PNG
    img.save(path)
    return path


def _panel(draw, x0: int, y0: int, title: str, labels: list[str], series: dict) -> None:
    """One histogram: a step line per split over the bins, labels at both ends and the middle."""
    left, right, top, bottom = x0 + 12, x0 + PANEL[0] - 12, y0 + 22, y0 + PANEL[1] - 30
    draw.text((left, y0 + 6), title, fill="black")
    draw.line([(left, bottom), (right, bottom)], fill=(120, 120, 120))
    peak = max((v for values in series.values() for v in values), default=0) or 1
    width = (right - left) / max(len(labels), 1)
    for split, values in series.items():
        points = []
        for i, v in enumerate(values):
            y = bottom - (bottom - top) * v / peak
            points += [(left + i * width, y), (left + (i + 1) * width, y)]
        if points:
            draw.line(points, fill=COLOURS[split], width=2)
    draw.text((x0 + PANEL[0] - 60, top), f"max {peak:.0%}", fill=(90, 90, 90))
    for i in sorted({0, len(labels) // 2, len(labels) - 1}) if labels else []:
        text = labels[i][:16]
        x = min(left + i * width, right - draw.textlength(text))  # the last one inside
        draw.text((x, bottom + 4 + 12 * (i % 2)), text, fill="black")
