"""Stage `export`: SavedModel, ONNX and TFLite with parity checks, then registration.

Output (`paths.export`, built in a staging folder and swapped in whole before the
version is registered; `registered.json` is written right after registration):
- `saved_model/<export.model_name>/1/`: TensorFlow Serving layout, signatures
  `serve_image_bytes` (= `serving_default`) and `serve_preprocessed`, reloaded
  and run in a fresh process as part of the check;
- `model.onnx` (tf2onnx, opset from params, `onnx.checker` full check) whose
  ONNX Runtime outputs must match Keras on the whole test split (max abs diff
  <= export.atol, identical top-1), else the stage fails saying by how much;
- `model.tflite`: quantize's edge variant;
- `serving.json` (the served runtime: the fastest one that passed parity),
  `model_card.md`, `skew.json` (every served path against Keras, `serving.skew`:
  a gated pair out of bounds fails the stage), `registered.json` ({name, version,
  run_id, model_uri}).
Reports: `reports/export.json` (metrics, the skew pairs' among them) and
`reports/export_formats.csv` (every format's accuracy, size and p50 latency).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from tfmlops import registry, tracking
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import staging_dir, swap_in, write_csv, write_json, write_text
from tfmlops.serving import mlflow_model
from tfmlops.serving.skew import skew_metrics

log = logging.getLogger(__name__)

STAGE = "export"
REGISTERED_FILE = "registered.json"
SKEW_FILE = "skew.json"  # the training/serving skew report (serving.skew)
FORMATS_CSV = "export_formats.csv"
COLUMNS = ["format", "file", "bytes", "accuracy", "p50_ms", "p95_ms", "max_abs_diff",
           "top1_mismatches", "parity", "served"]


def run(cfg: Config) -> dict:
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.model.artifacts import trained_config, trained_model_path

    prepared = load_prepared(cfg)
    tcfg = trained_config(cfg)  # fails clearly when train has not run
    edge = read_edge(cfg)
    out = staging_dir(cfg.paths.export)
    upstream = {"prepare": cfg.paths.prepared, "train": cfg.paths.train,
                "quantize": cfg.paths.tflite}
    with tracking.stage_run(cfg, STAGE, out, upstream=upstream,
                            params={"export": cfg.to_dict()["export"],
                                    "promote.registered_model": cfg.promote.registered_model}) as run:
        # TensorFlow loads after the run opened: a dead tracking server fails first.
        from tfmlops.data.stored_split import StoredSplit
        from tfmlops.serving import formats as fmt
        from tfmlops.serving.card import model_card

        model = fmt.float32_model(trained_model_path(cfg), tcfg, prepared)
        # The test split is read batch by batch by every check, never held whole.
        split = StoredSplit.of(prepared)
        y = split.labels()
        keras_probs = split.predict(lambda x: model.predict(x, batch_size=256, verbose=0))
        formats = fmt.build_formats(cfg, model, prepared, edge, out, split, keras_probs)
        first_image = split.first[0]
        _profile_serving(cfg, run, formats["saved_model"], first_image)
        rows, parities = fmt.measure(cfg, model, out, formats, split, y, keras_probs)
        parities.append(formats["reload_parity"])  # the bytes signature, in a fresh process
        serving = fmt.choose_serving(rows, parities)
        fmt.write_serving_config(out, serving, prepared,
                                 dataclasses.asdict(cfg.export.serving))
        served_row, pairs = fmt.check_serving_paths(cfg, prepared, model, out, serving, split,
                                                    y, keras_probs, parities, out / SKEW_FILE)
        rows.append(served_row)
        for r in rows:
            r["served"] = r["format"] == serving["runtime"]

        lineage = registry_lineage(cfg, run.run_id)
        data = {"classes": prepared.classes, "image_size": prepared.image_size,
                "channels": prepared.channels, "counts": prepared.counts,
                "version": tracking.data_version(cfg), "mean": prepared.mean, "std": prepared.std}
        card = model_card(cfg.promote.registered_model, data, rows,
                          [p.to_dict() for p in parities], edge, serving, lineage)
        write_text(out / "model_card.md", card)
        # Outputs in place first, then register, then name the version beside them: a
        # failure before registration leaves no version without its registered.json.
        final = swap_in(out, cfg.paths.export)
        registered = register(cfg, run, final, serving,
                              version_tags(rows, parities, serving, lineage), card, first_image)
        write_json(final / REGISTERED_FILE, registered)

        metrics = {**export_metrics(rows, parities, serving), **skew_metrics(pairs),
                   "registered_version": int(registered["version"] or 0)}
        run.log_metrics(metrics)
        run.set_tags({"tfmlops.export.served_runtime": serving["runtime"],
                      "tfmlops.export.parity": str(all_parity_passed(parities)).lower()})
        reports = Path(cfg.paths.reports)
        write_csv(reports / FORMATS_CSV, rows, COLUMNS)
        write_json(reports / "export.json", metrics)
        run.log_artifact(reports / FORMATS_CSV, "reports")
    log.info("%s", format_table(rows, serving, registered))
    return metrics


# ------------------------------------------------------------------ inputs

def _profile_serving(cfg: Config, run, saved: Path, image: bytes) -> None:
    """A profiler trace of the SavedModel's bytes-in serving function, warmed up first."""
    import tensorflow as tf

    from tfmlops import profiling

    if not cfg.profiling.enabled:
        return
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    name = next(iter(serve.structured_input_signature[1]))
    batch = tf.constant([image])
    for _ in range(cfg.profiling.start_step):  # tracing and first calls stay out of the trace
        serve(**{name: batch})
    with profiling.trace(cfg, STAGE) as folder:
        for _ in range(cfg.profiling.steps):
            serve(**{name: batch})
    run.log_artifact(folder, "profile")


def read_edge(cfg: Config) -> dict:
    """quantize's choice of edge variant: {"variant", "file", "accuracy", "bytes"}."""
    path = Path(cfg.paths.tflite) / "edge.json"
    if not path.is_file():
        raise DataError(f"{path} not found; run `dvc repro quantize` first")
    edge = json.loads(path.read_text())
    if not (Path(cfg.paths.tflite) / str(edge.get("file", ""))).is_file():
        raise DataError(f"{path} names {edge.get('file')!r}, which is not in {cfg.paths.tflite}; "
                        "run `dvc repro quantize` again")
    return edge


def all_parity_passed(parities) -> bool:
    """The parities the stage requires (every runtime but the quantized edge variant)."""
    return all(p.passed for p in parities if p.runtime != "tflite")


def export_metrics(rows, parities, serving) -> dict:
    metrics = {}
    for r in rows:
        for key in ("accuracy", "bytes", "p50_ms"):
            metrics[f"{r['format']}.{key}"] = r[key]
    for p in parities:
        metrics[f"parity.{p.runtime}.max_abs_diff"] = p.max_abs_diff
    metrics["parity.passed"] = int(all_parity_passed(parities))
    metrics.update({f"serving.{k}": v for k, v in serving.items() if k in
                    ("accuracy", "bytes", "latency_p50_ms")})
    return metrics


# ---------------------------------------------------------------- registry

def register(cfg, run, out: Path, serving, tags: dict, card, example_png) -> dict:
    """Log the served model to MLflow and register a version (the one registered for the
    same inputs if a run before this one got that far); {name, version, run_id, model_uri}."""
    name = cfg.promote.registered_model
    if not run.active:
        log.warning("export: tracking is off: the model is not registered "
                    "(promote needs the registry)")
        return {"name": name, "version": None, "run_id": None, "model_uri": None}
    log.info("export: logging the formats and registering %s in MLflow", name)
    run.log_artifact(out / "model_card.md")
    run.log_artifact(out / SKEW_FILE)
    for fmt in ("saved_model", "model.onnx", "model.tflite"):
        run.log_artifact(out / fmt, "formats")
    uri = mlflow_model.log_serving_model(run, out, serving["file"], mlflow_model.request_example(example_png))
    if uri is None:
        raise DataError(f"the served model could not be logged to MLflow ({'; '.join(run.errors)})"
                        "; fix the tracking store and run export again")
    # Keyed by the inputs, not this run or the converted bytes (both differ on a rerun):
    # a rerun after a crash between registering and registered.json finds its version.
    key = registration_key(cfg)
    reg = registry.Registry(cfg, name)
    version = reg.register(uri, tags, card, key=key)
    log.info("export: registered %s version %s", name, version)
    return {"name": name, "version": version, "run_id": run.run_id,
            "model_uri": reg.source(version)}  # an earlier run's, if it registered these inputs


def registration_key(cfg: Config) -> str:
    """sha256 of the trained model, quantize's edge variant and export's params."""
    from tfmlops.model.artifacts import trained_model_path

    edge = read_edge(cfg)
    params = json.dumps({"export": cfg.to_dict()["export"], "name": cfg.promote.registered_model},
                        sort_keys=True)
    return ":".join([registry.content_digest(trained_model_path(cfg)),
                     registry.content_digest(Path(cfg.paths.tflite) / edge["file"]),
                     hashlib.sha256(params.encode()).hexdigest()[:16]])


def version_tags(rows, parities, serving, lineage) -> dict[str, str]:
    tags = {}
    for r in rows:
        tags[f"accuracy.{r['format']}"] = f"{r['accuracy']:.6f}"
        tags[f"bytes.{r['format']}"] = str(r["bytes"])
        tags[f"latency_p50_ms.{r['format']}"] = f"{r['p50_ms']:.4f}"
    for p in parities:
        tags[f"parity.{p.runtime}"] = (f"{'pass' if p.passed else 'fail'} max_abs_diff="
                                       f"{p.max_abs_diff:.3g} top1_mismatches={p.top1_mismatches}")
    tags[registry.TAG_PARITY] = str(all_parity_passed(parities)).lower()
    tags["serving.runtime"] = serving["runtime"]
    tags[registry.TAG_ACCURACY] = f"{serving['accuracy']:.6f}"
    tags[registry.TAG_BYTES] = str(serving["bytes"])
    tags[registry.TAG_LATENCY] = f"{serving['latency_p50_ms']:.4f}"
    return {**tags, **lineage}


def registry_lineage(cfg: Config, export_run_id: str | None) -> dict[str, str]:
    """Git commit, dvc.lock hashes of the data, run ids of every upstream stage."""
    root = tracking.repo_root()
    commit, dirty = tracking.git_state(root)
    tags = {"lineage.git_commit": commit, "lineage.git_dirty": str(dirty).lower(),
            "lineage.data_version": tracking.data_version(cfg)}
    folders = {"prepare": cfg.paths.prepared, "tune": cfg.paths.tuned, "train": cfg.paths.train,
               "prune": cfg.paths.pruned, "quantize": cfg.paths.tflite}
    for stage, folder in folders.items():
        tags[f"lineage.run.{stage}"] = tracking.read_run_file(folder).get("run_id") or "none"
    tags["lineage.run.export"] = export_run_id or "none"
    tags.update(tracking.dvc_data_hashes(cfg, root))
    return tags


def format_table(rows, serving, registered) -> str:
    """One message: the summary line, then every format's row under a header (aligned)."""
    lines = [f"export: serving {serving['runtime']}; registered version {registered['version']}",
             f"  {'format':<20}{'accuracy':>10}{'bytes':>12}{'p50 ms':>10}"]
    lines += [f"  {r['format']:<20}{r['accuracy']:>10.4f}{r['bytes']:>12,}{r['p50_ms']:>10.3f}"
              for r in rows]
    return "\n".join(lines)
