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

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from tfmlops import harness
from tfmlops.artifacts import (
    FORMATS_CSV,
    MODEL_CARD,
    REGISTERED,
    SKEW,
    TAG_PARITY_PASSED,
    TAG_SERVED_RUNTIME,
    data_version,
)
from tfmlops.files import write_csv, write_json, write_text
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="export",
    help="SavedModel, ONNX and TFLite with parity checks; registers the model",
    output="export",
    upstream=("prepare", "train", "quantize"),
    params=("export", "promote.registered_model", "tracking.enabled"),
    reports=("export.json", "export_formats.csv"),
    headline=("serving.accuracy", "serving.bytes", "serving.latency_p50_ms", "parity.passed",
              "registered_version", "tflite.accuracy", "tflite.bytes", "tflite.p50_ms",
              "onnx.p50_ms", "keras.p50_ms"),
    sidecar=True,
)
COLUMNS = ["format", "file", "bytes", "accuracy", "p50_ms", "p95_ms", "max_abs_diff",
           "top1_mismatches", "parity", "served"]


def run(cfg: Config) -> dict:
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.model.trained import trained_config, trained_model_path
    from tfmlops.stages.export import registration as reg
    from tfmlops.stages.export.skew import skew_metrics

    prepared = load_prepared(cfg)
    tcfg = trained_config(cfg)  # fails clearly when train has not run
    edge = reg.read_edge(cfg)
    params = {"export": cfg.to_dict()["export"],
              "promote.registered_model": cfg.promote.registered_model}
    # The sidecar keeps the run and registers: the store's client is its import, not ours.
    with harness.stage(cfg, SPEC, params=params) as st:
        out, run = st.out, st.run
        from tfmlops.data.stored_split import StoredSplit
        from tfmlops.stages.export import formats as fmt

        model = fmt.float32_model(trained_model_path(cfg), tcfg, prepared)
        # The test split is read batch by batch by every check, never held whole.
        split = StoredSplit.of(prepared)
        y = split.labels()
        keras_probs = split.predict(lambda x: model.predict(x, batch_size=256, verbose=0))
        with fmt.formats_built(cfg, model, prepared, edge, out, split, keras_probs) as formats:
            first_image = split.first[0]  # read after the SavedModel is traced: its names stay
            _profile_serving(cfg, st, formats["saved_model"], first_image)
            rows, parities = fmt.measure(cfg, model, out, formats, split, y, keras_probs)
        serving = fmt.choose_serving(rows, parities)
        fmt.write_serving_config(out, serving, prepared,
                                 cfg.to_dict()["export"]["serving"])
        served_row, pairs = fmt.check_serving_paths(cfg, prepared, model, out, serving, split,
                                                    y, keras_probs, parities, out / SKEW)
        rows.append(served_row)
        for r in rows:
            r["served"] = r["format"] == serving["runtime"]

        run.wait_open()  # its run id goes into the lineage
        lineage = reg.registry_lineage(cfg, run.run_id)
        data = {"classes": prepared.classes, "image_size": prepared.image_size,
                "channels": prepared.channels, "counts": prepared.counts,
                "version": data_version(cfg.paths.prepared), "mean": prepared.mean, "std": prepared.std}
        card = reg.model_card(cfg.promote.registered_model, data, rows,
                          [p.to_dict() for p in parities], edge, serving, lineage)
        write_text(out / MODEL_CARD, card)
        # Outputs in place first, then register, then name the version beside them: a
        # failure before registration leaves no version without its registered.json.
        final = st.swap()
        registered = run.perform(reg.register, cfg, final, serving,
                                 reg.version_tags(rows, parities, serving, lineage, edge), card,
                                 first_image)
        write_json(final / REGISTERED, registered)

        metrics = st.report({**reg.export_metrics(rows, parities, serving), **skew_metrics(pairs),
                             "registered_version": int(registered["version"] or 0)})
        run.set_tags({TAG_SERVED_RUNTIME: serving["runtime"],
                      TAG_PARITY_PASSED: str(reg.all_parity_passed(parities)).lower()})
        formats_csv = write_csv(Path(cfg.paths.reports) / FORMATS_CSV, rows,
                                COLUMNS)
        run.log_artifact(formats_csv, "reports")
    log.info("%s", reg.format_table(rows, serving, registered))
    return metrics


# ------------------------------------------------------------------ inputs

def _profile_serving(cfg: Config, st, saved: Path, image: bytes) -> None:
    """A profiler trace of the SavedModel's bytes-in serving function, warmed up first."""
    import tensorflow as tf

    if not cfg.profiling.enabled:
        return
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    name = next(iter(serve.structured_input_signature[1]))
    batch = tf.constant([image])
    for _ in range(cfg.profiling.start_step):  # tracing and first calls stay out of the trace
        serve(**{name: batch})
    with st.trace():
        for _ in range(cfg.profiling.steps):
            serve(**{name: batch})
