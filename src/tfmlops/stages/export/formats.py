"""Every exported format: built, reloaded, checked for parity and measured, in the order
`export` calls these; a required parity that fails raises DataError saying by how much.

Every check reads the test split batch by batch (`data.stored_split.StoredSplit`):
what stays in memory is per image (labels, probabilities), never the images.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np

from tfmlops.artifacts import MODEL_FILE, SERVING
from tfmlops.config import Config, ServingLimits
from tfmlops.errors import DataError
from tfmlops.files import write_json
from tfmlops.runtimes import OnnxModel, TFLiteModel, accuracy, latency_ms
from tfmlops.stages.export import skew
from tfmlops.stages.export.mlflow_model import request_example, save_serving_model

log = logging.getLogger(__name__)

LATENCY_THREADS = 1  # single-image latency, one thread (as quantize measures)


def float32_model(path: Path, tcfg: Config, prepared):
    """The trained model computing in float32: what every exported format reproduces. A
    mixed-precision model keeps float32 weights; it is rebuilt under the float32 policy and
    gets them copied (CPU runtimes serve float32 anyway)."""
    import keras

    from tfmlops.model.trained import load_keras3, rebuild

    model = load_keras3(path)
    if all(layer.dtype_policy.compute_dtype == "float32" for layer in model.layers):
        return model
    keras.mixed_precision.set_global_policy("float32")
    return rebuild(model, tcfg, keras, prepared.input_shape, prepared.num_classes)


@contextlib.contextmanager
def formats_built(cfg, model, prepared, edge, out: Path, split, keras_probs) -> Iterator[dict]:
    """Write every format into `out`; fail on the first parity the stage requires. The
    SavedModel's reload check runs in a fresh process beside the rest of the block (its
    TensorFlow import is most of its time): `formats["reload_parity"]()` waits for it. It is
    stopped if the block ends first."""
    from tfmlops.stages.export.signatures import export_saved_model

    saved = out / "saved_model" / cfg.export.model_name / "1"  # the folder is rebuilt: one version
    log.info("export: [1/3] SavedModel: writing, then reloading it in a fresh process")
    export_saved_model(model, saved, prepared.classes, prepared.image_size, prepared.channels,
                       prepared.mean, prepared.std, prepared.stored_size,
                       max_pixels=cfg.export.serving.max_image_pixels)
    with ReloadCheck(saved, split) as reload:
        onnx_path = out / "model.onnx"
        log.info("export: [2/3] ONNX: converting (opset %d), checking parity", cfg.export.onnx_opset)
        to_onnx(model, onnx_path, prepared.input_shape, cfg.export.onnx_opset)
        onnx_model = OnnxModel(str(onnx_path), LATENCY_THREADS)
        _, onnx_probs = check_onnx(onnx_path, split, keras_probs, cfg.export.atol, onnx_model)
        log.info("export: [3/3] TFLite: the edge variant %s from quantize", edge["variant"])
        shutil.copy2(Path(cfg.paths.tflite) / edge["file"], out / "model.tflite")
        yield {"saved_model": saved, "onnx": onnx_path, "tflite": out / "model.tflite",
               # measure's ONNX session and predictions: the check's, the same settings
               "onnx_model": onnx_model, "onnx_probs": onnx_probs,
               "reload_parity": lambda: reload.parity(keras_probs, prepared.classes,
                                                      cfg.export.atol)}


class ReloadCheck:
    """The SavedModel reloaded in a fresh process (`signatures.main`), started at once;
    `parity` waits for it and checks that both signatures match Keras, returning the bytes
    signature's parity. Leaving the block stops the process if it still runs."""

    def __init__(self, saved: Path, split):
        self._tmp = tempfile.TemporaryDirectory(prefix="tfmlops-reload-")
        self.folder = Path(self._tmp.name)
        write_json(self.folder / "split.json", split.to_dict())
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
        with (self.folder / "stderr.txt").open("w") as err:  # a file: a full pipe would stall it
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tfmlops.stages.export.signatures", str(saved),
                 str(self.folder / "split.json"), str(self.folder / "out.npz")],
                stdout=subprocess.DEVNULL, stderr=err, env=env)

    def __enter__(self) -> ReloadCheck:
        return self

    def __exit__(self, *exc) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._tmp.cleanup()

    def parity(self, keras_probs, classes, atol: float):
        try:
            self._proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            raise
        if self._proc.returncode != 0:
            stderr = (self.folder / "stderr.txt").read_text(errors="replace")
            last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise DataError(f"the SavedModel did not reload in a fresh process ({last})")
        with np.load(self.folder / "out.npz", allow_pickle=False) as result:
            got = {k: result[k] for k in result.files}
        floats = skew.compare("saved_model", keras_probs, got["float_probabilities"], atol)
        encoded = skew.compare("saved_model_bytes", keras_probs, got["bytes_probabilities"], atol)
        expected = np.asarray(classes)[np.argmax(keras_probs, axis=1)]
        for c in (floats, encoded):
            if not c.passed:
                raise DataError(f"SavedModel reloaded in a fresh process: {c.describe()}")
        if not np.array_equal(got["bytes_labels"], expected):
            raise DataError("SavedModel reloaded in a fresh process: its `label` output disagrees "
                            "with the class names of the top-1 probabilities")
        if not np.allclose(got["default_probabilities"], got["bytes_probabilities"][:1]):
            raise DataError("SavedModel: serving_default is not the image-bytes signature")
        return encoded  # export counts the bytes signature's among the parities


def to_onnx(model, path: Path, input_shape, opset: int) -> None:
    import onnx
    import tensorflow as tf
    import tf2onnx

    spec = (tf.TensorSpec((None, *input_shape), tf.float32, name="image"),)
    try:
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset, output_path=str(path))
    except Exception as exc:  # noqa: BLE001 - tf2onnx raises many kinds
        raise DataError(f"tf2onnx could not convert the model at opset {opset} "
                        f"({str(exc).splitlines()[0][:160]}); try another export.onnx_opset") from None
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise DataError(f"{path.name} fails onnx.checker ({str(exc).splitlines()[0][:160]})") from None


def check_onnx(path: Path, split, keras_probs, atol: float, model: OnnxModel | None = None):
    """ONNX Runtime (`model`, else a session of `path`) on the whole test split against
    Keras: (its parity, its probabilities)."""
    probs = split.predict((model or OnnxModel(str(path), LATENCY_THREADS)).predict)
    result = skew.compare("onnx", keras_probs, probs, atol)
    if not result.passed:
        raise DataError(f"{result.describe()}; raise export.atol only if that is acceptable")
    return result, probs


def measure(cfg, model, out: Path, formats: dict, split, y, keras_probs):
    """One row per format (accuracy, bytes, latency) and the parity of each runtime, the
    reloaded SavedModel's bytes signature last. The reload check is waited for before the
    first timed call: latencies are measured without it running beside them."""
    import tensorflow as tf

    from tfmlops.stages.export.signatures import FLOAT_SIGNATURE

    sig = tf.saved_model.load(str(formats["saved_model"])).signatures[FLOAT_SIGNATURE]
    onnx_model = formats["onnx_model"]
    tflite_model = TFLiteModel(str(formats["tflite"]), LATENCY_THREADS)

    def saved_model(x):
        return sig(image=tf.constant(x))["probabilities"].numpy()

    probs = {"keras": keras_probs, "saved_model": split.predict(saved_model),
             "onnx": formats["onnx_probs"],
             "tflite": split.predict(lambda x: tflite_model.predict_all(x, batch=64))}
    reloaded = formats["reload_parity"]()
    call = {"keras": lambda a: model(a, training=False).numpy(),  # eager Keras, one image
            "saved_model": saved_model, "onnx": onnx_model.predict, "tflite": tflite_model.predict}
    files = {"keras": Path(cfg.paths.train) / MODEL_FILE,
             **{k: formats[k] for k in ("saved_model", "onnx", "tflite")}}
    rows, parities = [], []
    for k, name in enumerate(("keras", "saved_model", "onnx", "tflite"), 1):
        log.info("export: [%d/4] measuring %s: accuracy, %d timed calls", k, name, cfg.export.latency_runs)
        row = {"format": name, "file": _rel(files[name], out), "bytes": _size(files[name]),
               "accuracy": accuracy(probs[name], y), **_latency(cfg, call[name], split.first[1])}
        if name != "keras":
            p = skew.compare(name, keras_probs, probs[name], cfg.export.atol)
            parities.append(p)
            row.update(_parity_columns(p))
        rows.append(row)
    return rows, [*parities, reloaded]


def choose_serving(rows: list[dict], parities) -> dict:
    """The fastest runtime the served model can run that passed parity."""
    passed = {p.runtime for p in parities if p.passed}
    options = [r for r in rows if r["format"] in ("onnx", "tflite") and r["format"] in passed]
    if not options:
        raise DataError("no runtime the served model can run (ONNX, TFLite) passed parity")
    best = min(options, key=lambda r: r["p50_ms"])
    return {"runtime": best["format"], "file": best["file"], "bytes": best["bytes"],
            "accuracy": best["accuracy"], "latency_p50_ms": best["p50_ms"]}


def write_serving_config(out: Path, serving: dict, prepared, limits: dict | None = None) -> None:
    """serving.json: what the served model needs, with `export.serving`'s caps (None: defaults)."""
    limits = limits if limits is not None else msgspec.to_builtins(ServingLimits())
    write_json(out / SERVING, {
        "runtime": serving["runtime"], "file": serving["file"], "classes": prepared.classes,
        "image_size": prepared.image_size, "channels": prepared.channels,
        "mean": prepared.mean, "std": prepared.std, "stored_size": prepared.stored_size,
        "threads": LATENCY_THREADS, "limits": limits})


def check_serving_paths(cfg, prepared, model, out: Path, serving: dict, split, y,
                        keras_probs, parities, report_path: Path) -> tuple[dict, list]:
    """The served MLflow model checked on the stored test images, then every pair of the skew
    report (`serving.skew`), the report written to `report_path`: (served row, skew pairs)."""
    log.info("export: checking the served MLflow model (%s) on the test split's stored "
             "images", serving["runtime"])
    with tempfile.TemporaryDirectory(prefix="tfmlops-served-") as tmp:
        served = save_serving_model(out, serving["file"], request_example(split.first[0]),
                                    Path(tmp) / "model")
        row = check_served(cfg, serving, served, split, y, keras_probs, parities)
        log.info("export: following %d original files through prepare's path and the served "
                 "model's", cfg.export.skew.source_images)
        sources, facts = skew.source_pairs(prepared, model, served, cfg.export.skew)
    by = {p.runtime: p for p in parities}
    pairs = [*(skew.Pair(n, by[n]) for n in ("saved_model", "saved_model_bytes", "served_pyfunc", "onnx")),
             skew.Pair("tflite_edge", by["tflite"], gated=False), *sources]
    skew.check(pairs)
    write_json(report_path, skew.report(pairs, facts))
    return row, pairs


def check_served(cfg, serving: dict, served, split, y, keras_probs, parities) -> dict:
    """The served MLflow model on the stored test bytes vs Keras on the pipeline's tensors.
    Its latency is one request row end to end in-process (base64 image -> label), which is
    what the gate's latency budget limits."""
    limits = cfg.export.serving  # rows per request: image rows its caps always admit
    rows = max(1, min(limits.max_rows, limits.max_request_pixels // limits.max_image_pixels))
    probs = split.predict_encoded(lambda encoded: skew.pyfunc_probabilities(served, encoded, rows))
    p = skew.compare("served_pyfunc", keras_probs, probs, cfg.export.atol)
    parities.append(p)
    if not p.passed:
        raise DataError(f"the served model's decoding or preprocessing drifted from training: {p.describe()}")
    predict_rows = served.unwrap_python_model().predictor.predict_rows  # the served model's own
    timing = _latency(cfg, predict_rows, [request_example(split.first[0])])
    serving["latency_p50_ms"] = timing["p50_ms"]
    return {"format": "served_pyfunc", "file": serving["file"], "bytes": serving["bytes"],
            "accuracy": accuracy(probs, y), **timing, **_parity_columns(p)}


def _latency(cfg, fn, x1) -> dict[str, float]:
    runs = cfg.export.latency_runs
    return latency_ms(fn, x1, runs, max(1, runs // 10))


def _parity_columns(p) -> dict:
    return {"max_abs_diff": p.max_abs_diff, "top1_mismatches": p.top1_mismatches, "parity": p.passed}


def _rel(path: Path, out: Path) -> str:
    return str(path.relative_to(out) if path.is_relative_to(out) else path)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size
