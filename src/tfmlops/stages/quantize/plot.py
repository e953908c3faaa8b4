"""The frontier picture: accuracy against size, latency as colour, the edge pick starred.

Variants of similar size and accuracy overlap, so each point carries a number
and the table beside the plot names it (size, accuracy, p50 latency).
"""

from __future__ import annotations

from pathlib import Path

from tfmlops.files import pyplot, write_png

MARKERS = {"pruned": "o", "trained": "s"}  # the source model; QAT gets a diamond


def frontier_png(rows: list[dict], edge: dict, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    latencies = [r["p50_ms"] for r in rows]
    norm = plt.Normalize(min(latencies), max(latencies) if len(rows) > 1 else min(latencies) + 1)
    points = None
    lines = [f"{'#':>2} {'variant':<16} {'KiB':>7} {'accuracy':>8} {'p50 ms':>7}"]
    for number, r in enumerate(rows, start=1):
        kib = r["bytes"] / 1024
        marker = "D" if "qat" in r["variant"] else MARKERS.get(r["variant"].split("_")[0], "o")
        points = ax.scatter([kib], [r["accuracy"]], c=[r["p50_ms"]], cmap="viridis", norm=norm,
                            marker=marker, s=80, edgecolors="black", zorder=2)
        ax.annotate(str(number), (kib, r["accuracy"]), fontsize=8, textcoords="offset points",
                    xytext=(6, 4 + 7 * (number % 2)))
        lines.append(f"{number:>2} {r['variant']:<16} {kib:7.1f} {r['accuracy']:8.4f} "
                     f"{r['p50_ms']:7.3f}")
    fig.colorbar(points, ax=ax, label="p50 latency, batch 1 (ms)")
    ax.axhline(edge["reference_accuracy"], color="grey", lw=1, label="Keras reference")
    ax.axhline(edge["reference_accuracy"] - edge["accuracy_budget"], color="red", ls="--", lw=1,
               label="accuracy budget")
    ax.scatter([edge["bytes"] / 1024], [edge["accuracy"]], marker="*", s=320, c="red",
               label=f"edge: {edge['variant']}", zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("TFLite size (KiB, log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Compression frontier (circle: pruned, square: trained, diamond: QAT)")
    ax.legend(loc="lower right", fontsize=8)
    fig.text(0.665, 0.5, "\n".join(lines), family="monospace", fontsize=8, va="center")
    fig.subplots_adjust(left=0.085, right=0.6)
    return write_png(path, fig, dpi=110)
