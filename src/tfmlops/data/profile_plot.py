"""The data profile as one PNG for the `prepare` run in MLflow: images per class and
split, and every feature's histogram per split (shares of the split, so splits of
different sizes overlay). matplotlib's object API on the Agg canvas: no pyplot, no
display, no global state; imported only when a PNG is drawn.
"""

from __future__ import annotations

from pathlib import Path

from tfmlops.data.images import SPLITS
from tfmlops.data.profile import CATEGORIES, EDGES, split_histograms


def plot_profile(summary: dict, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 10))
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 4).ravel()
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.06, top=0.95, wspace=0.25, hspace=0.45)
    classes = summary["classes"]
    for k, split in enumerate(SPLITS):
        counts = [summary["counts"][split][c] for c in classes]
        axes[0].bar([i + 0.27 * (k - 1) for i in range(len(classes))], counts, 0.27, label=split)
    axes[0].set_xticks(range(len(classes)), classes if len(classes) <= 20 else [""] * len(classes))
    axes[0].set_title("images per class")
    axes[0].legend(fontsize=8)
    for ax, feature in zip(axes[1:], [*EDGES, *CATEGORIES], strict=False):
        hists = split_histograms(summary, feature)
        names = sorted({n for h in hists.values() for n in h}) if feature in CATEGORIES else None
        for split in SPLITS:
            values = [hists[split].get(n, 0) for n in names] if names else hists[split]
            total = max(sum(values), 1)
            ax.stairs([v / total for v in values], range(len(values) + 1), label=split)
        if names:
            ax.set_xticks([i + 0.5 for i in range(len(names))], names)
        else:
            edges = EDGES[feature]
            ticks = list(range(1, len(edges) + 1, max(1, len(edges) // 4)))
            ax.set_xticks(ticks, [f"{edges[i - 1]:g}" for i in ticks])
        ax.set_title(f"{feature} (share of split)")
    axes[-1].set_visible(False)
    fig.savefig(path, dpi=60)
    return path
