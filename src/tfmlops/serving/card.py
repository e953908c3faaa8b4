"""The model card: a Markdown page generated from what `export` measured.

It becomes the registered version's description and a `model_card.md`
artifact: the data, every format's accuracy/size/latency, compression,
parity, the served runtime, lineage and how to serve the model.
"""

from __future__ import annotations

from typing import Any


def model_card(name: str, data: dict[str, Any], rows: list[dict[str, Any]],
               parity: list[dict[str, Any]], edge: dict[str, Any], serving: dict[str, Any],
               lineage: dict[str, str]) -> str:
    lines = [
        f"# {name}",
        "",
        f"Image classifier over {len(data['classes'])} classes ({', '.join(data['classes'])}); "
        f"input {data['image_size']}x{data['image_size']}x{data['channels']}.",
        "",
        "## Data",
        f"- images per split: {data['counts']}",
        f"- data version (manifest hash): {data['version']}",
        f"- normalization: mean {_short(data['mean'])}, std {_short(data['std'])} (train split)",
        "",
        "## Formats (test split, latency: one image, one thread, p50)",
        "| format | accuracy | bytes | p50 ms |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['format']} | {r['accuracy']:.4f} | {r['bytes']:,} | {r['p50_ms']:.3f} |"
              for r in rows]
    lines += ["", "## Compression",
              f"- edge TFLite variant: {edge.get('variant')} ({edge.get('bytes', 0):,} bytes, "
              f"accuracy {edge.get('accuracy', float('nan')):.4f} as measured by quantize)",
              "", "## Parity against Keras (whole test split)"]
    lines += [f"- {p['runtime']}: max abs diff {p['max_abs_diff']:.3g} (atol {p['atol']:g}), "
              f"{p['top1_mismatches']} top-1 mismatches: {'pass' if p['passed'] else 'FAIL'}"
              for p in parity]
    lines += ["", "## Serving",
              f"- runtime: {serving['runtime']} (fastest format that passed parity), "
              f"p50 {serving['latency_p50_ms']:.3f} ms, accuracy {serving['accuracy']:.4f}",
              f"- `mlflow models serve -m models:/{name}@production --env-manager local -p 5001`",
              '- request: `{"dataframe_records": [{"image": "<base64 PNG or JPEG>"}]}` '
              'or `{"dataframe_records": [{"pixels": [<H*W*C normalized floats>]}]}`',
              "", "## Lineage"]
    lines += [f"- {k}: {v}" for k, v in sorted(lineage.items())]
    return "\n".join(lines) + "\n"


def _short(values) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"
