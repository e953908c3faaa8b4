"""What export records about the formats it built, and the model version it registers.

The version tags (accuracy, bytes, latency, parity per format, lineage) are what
`promote`'s gate reads; the model card, a Markdown page of what export measured,
becomes the version's description and a `model_card.md` artifact.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from tfmlops import registry, tracking
from tfmlops.artifacts import (
    EDGE,
    MODEL_CARD,
    MODEL_FILE,
    SKEW,
    TAG_ACCURACY,
    TAG_BYTES,
    TAG_EDGE_AGREEMENT,
    TAG_LATENCY,
    TAG_LINEAGE_COMMIT,
    TAG_LINEAGE_DATA,
    TAG_LINEAGE_RUN,
    TAG_PARITY,
    data_version,
    require,
    run_dir,
)
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.stages.export import mlflow_model

log = logging.getLogger(__name__)


def read_edge(cfg: Config) -> dict:
    """quantize's choice of edge variant: {"variant", "file", "accuracy", "bytes"}."""
    path = require(Path(cfg.paths.tflite) / EDGE, "quantize")
    edge = json.loads(path.read_text())
    if not (Path(cfg.paths.tflite) / str(edge.get("file", ""))).is_file():
        raise DataError(f"{path} names {edge.get('file')!r}, which is not in {cfg.paths.tflite}; "
                        "run `dvc repro quantize` again")
    return edge


def all_parity_passed(parities) -> bool:
    """The parities the stage requires (every runtime but the quantized edge variant)."""
    return all(p.passed for p in parities if p.runtime != "tflite")


def export_metrics(rows, parities, serving) -> dict:
    metrics = {f"{r['format']}.{key}": r[key] for r in rows for key in ("accuracy", "bytes", "p50_ms")}
    metrics.update({f"parity.{p.runtime}.max_abs_diff": p.max_abs_diff for p in parities})
    metrics["parity.passed"] = int(all_parity_passed(parities))
    metrics.update({f"serving.{k}": v for k, v in serving.items() if k in
                    ("accuracy", "bytes", "latency_p50_ms")})
    return metrics


def register(run, cfg, out: Path, serving, tags: dict, card, example_png) -> dict:
    """Log the served model and register a version: {name, version, run_id, model_uri}.
    Called as `run.perform(register, ...)`: in the tracking sidecar, which has the store."""
    name = cfg.promote.registered_model
    if not run.active:
        log.warning("export: tracking is off: the model is not registered (promote needs the registry)")
        return {"name": name, "version": None, "run_id": None, "model_uri": None, "store": None}
    log.info("export: logging the formats and registering %s in MLflow", name)
    run.log_artifact(out / MODEL_CARD)
    run.log_artifact(out / SKEW)
    for fmt in ("saved_model", "model.onnx", "model.tflite"):
        run.log_artifact(out / fmt, "formats")
    uri = mlflow_model.log_serving_model(run, out, serving["file"], mlflow_model.request_example(example_png))
    if uri is None:
        raise DataError(f"the served model could not be logged to MLflow ({'; '.join(run.errors)})"
                        "; fix the tracking store and run export again")
    # Keyed by the inputs, not this run or the converted bytes (both differ on a rerun):
    # a rerun after a crash between registering and registered.json finds its version.
    reg = registry.Registry(cfg)
    version = reg.register(uri, tags, card, key=registration_key(cfg))
    log.info("export: registered %s version %s", name, version)
    return {"name": name, "version": version, "run_id": run.run_id,
            "model_uri": reg.source(version),  # an earlier run's, if it registered these inputs
            "store": tracking.redact(reg.uri)}  # promote holds a version of another store


def registration_key(cfg: Config) -> str:
    """sha256 of the trained model, quantize's edge variant and export's params."""
    edge = read_edge(cfg)
    params = json.dumps({"export": cfg.to_dict()["export"], "name": cfg.promote.registered_model},
                        sort_keys=True)
    return ":".join([registry.content_digest(Path(cfg.paths.train) / MODEL_FILE),
                     registry.content_digest(Path(cfg.paths.tflite) / edge["file"]),
                     hashlib.sha256(params.encode()).hexdigest()[:16]])


def version_tags(rows, parities, serving, lineage, edge: dict) -> dict[str, str]:
    tags = {f"{key}.{r['format']}": value for r in rows for key, value in (
        ("accuracy", f"{r['accuracy']:.6f}"), ("bytes", str(r["bytes"])),
        ("latency_p50_ms", f"{r['p50_ms']:.4f}"))}
    tags.update({f"parity.{p.runtime}": f"{'pass' if p.passed else 'fail'} max_abs_diff="
                 f"{p.max_abs_diff:.3g} top1_mismatches={p.top1_mismatches}" for p in parities})
    tags.update({TAG_PARITY: str(all_parity_passed(parities)).lower(), "serving.runtime": serving["runtime"],
                 TAG_ACCURACY: f"{serving['accuracy']:.6f}", TAG_BYTES: str(serving["bytes"]),
                 TAG_LATENCY: f"{serving['latency_p50_ms']:.4f}"})
    if edge.get("agreement") is not None:  # an edge.json from before quantize recorded it: none
        tags[TAG_EDGE_AGREEMENT] = f"{edge['agreement']:.6f}"
    return {**tags, **lineage}


def registry_lineage(cfg: Config, export_run_id: str | None) -> dict[str, str]:
    """Git commit, dvc.lock hashes of the data, run ids of every upstream stage."""
    root = tracking.repo_root()
    commit, dirty = tracking.git_state(root)
    tags = {TAG_LINEAGE_COMMIT: commit, "lineage.git_dirty": str(dirty).lower(),
            TAG_LINEAGE_DATA: data_version(cfg.paths.prepared)}
    for stage in ("prepare", "tune", "train", "prune", "quantize"):
        tags[TAG_LINEAGE_RUN + stage] = tracking.linked_run_id(
            run_dir(cfg, stage), tags[TAG_LINEAGE_DATA]) or "none"
    tags[TAG_LINEAGE_RUN + "export"] = export_run_id or "none"
    tags.update(tracking.dvc_data_hashes(cfg, root))
    return tags


def format_table(rows, serving, registered) -> str:
    """One message: the summary line, then every format's row under a header (aligned)."""
    lines = [f"export: serving {serving['runtime']}; registered version {registered['version']}",
             f"  {'format':<20}{'accuracy':>10}{'bytes':>12}{'p50 ms':>10}"]
    lines += [f"  {r['format']:<20}{r['accuracy']:>10.4f}{r['bytes']:>12,}{r['p50_ms']:>10.3f}" for r in rows]
    return "\n".join(lines)


def model_card(name: str, data: dict[str, Any], rows: list[dict[str, Any]],
               parity: list[dict[str, Any]], edge: dict[str, Any], serving: dict[str, Any],
               lineage: dict[str, str]) -> str:
    lines = [f"# {name}", "",
             f"Image classifier over {len(data['classes'])} classes ({', '.join(data['classes'])}); "
             f"input {data['image_size']}x{data['image_size']}x{data['channels']}.",
             "", "## Data", f"- images per split: {data['counts']}",
             f"- data version (manifest hash): {data['version']}",
             f"- normalization: mean {_short(data['mean'])}, std {_short(data['std'])} (train split)",
             "", "## Formats (test split, latency: one image, one thread, p50)",
             "| format | accuracy | bytes | p50 ms |", "|---|---|---|---|"]
    lines += [f"| {r['format']} | {r['accuracy']:.4f} | {r['bytes']:,} | {r['p50_ms']:.3f} |" for r in rows]
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
