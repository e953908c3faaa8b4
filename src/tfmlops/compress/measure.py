"""Sizes and sparsity: gzip-compressed bytes, per-layer zero fractions, sparse tensors."""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

SPARSITY_COLUMNS = ("layer", "sparsity", "params", "prunable")


def gzip_bytes(path_or_data: str | Path | bytes) -> int:
    """Bytes after gzip at the highest level (the size a download would carry)."""
    data = path_or_data if isinstance(path_or_data, bytes) else Path(path_or_data).read_bytes()
    return len(gzip.compress(data, compresslevel=9, mtime=0))


def sparse_tensors(path: str | Path) -> int:
    """How many tensors of a .tflite file are stored in TFLite's sparse format."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(Path(path).read_bytes(), 0)
    return sum(model.Subgraphs(g).Tensors(t).Sparsity() is not None
               for g in range(model.SubgraphsLength())
               for t in range(model.Subgraphs(g).TensorsLength()))


def zero_fraction(arrays: Sequence[np.ndarray]) -> float:
    total = sum(int(a.size) for a in arrays)
    return sum(int(np.count_nonzero(a == 0)) for a in arrays) / total if total else 0.0


def sparsity_table(
    layers: Iterable[tuple[str, Sequence[np.ndarray], Sequence[np.ndarray]]],
) -> tuple[list[dict], dict[str, float]]:
    """Rows (layer, sparsity, params, prunable) and the overall figures.

    `layers` yields (name, all weights, the pruned weights): a layer is
    prunable when tfmot pruned some of its weights; its sparsity is the zero
    fraction of those (of all its weights otherwise). Layers without weights
    are left out. `sparsity` overall is over the pruned weights only;
    `sparsity_all_weights` over every parameter of the model.
    """
    rows, pruned, every = [], [], []
    for name, weights, pruned_weights in layers:
        weights = [np.asarray(w) for w in weights]
        if not weights:
            continue
        pruned_weights = [np.asarray(w) for w in pruned_weights]
        every += weights
        pruned += pruned_weights
        rows.append({"layer": name, "sparsity": round(zero_fraction(pruned_weights or weights), 6),
                     "params": sum(int(w.size) for w in weights), "prunable": bool(pruned_weights)})
    overall = {
        "sparsity": round(zero_fraction(pruned), 6),
        "sparsity_all_weights": round(zero_fraction(every), 6),
        "pruned_params": sum(int(w.size) for w in pruned),
        "params": sum(int(w.size) for w in every),
    }
    return rows, overall
