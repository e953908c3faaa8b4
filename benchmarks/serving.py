"""Serving: the promoted pyfunc model vs the plain MLflow Keras flavor, over HTTP.

Two `mlflow models serve --env-manager local` servers on 127.0.0.1: the
registered model's @production version (ONNX Runtime or LiteRT behind the
pyfunc) and the same trained Keras model logged with the plain Keras flavor
(`Model.predict` per request). Each answers the same single-image float
request; requests alternate between the two servers (so machine load hits
both alike), `--requests` timed per server after a warm-up, one keep-alive
connection each. Also timed: the pyfunc with a base64 PNG (decoding and
preprocessing in the server). Prints p50s and the ratio, writes
reports/benchmarks/serving.json.

    .venv/bin/python benchmarks/serving.py --scratch      # runs the stages first (minutes)
    .venv/bin/python benchmarks/serving.py                # uses params.yaml's @production
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save, scratch_config  # noqa: E402

VENV_BIN = Path(sys.executable).parent


def scratch_pipeline(epochs: int):
    """The real stages, each in its own process as DVC runs them, in a scratch folder."""
    workdir = Path(tempfile.mkdtemp(prefix="tfmlops-bench-"))
    cfg, _ = scratch_config(
        workdir, tracking={"enabled": True, "uri": f"sqlite:///{workdir / 'mlflow.db'}"},
        tune={"enabled": False}, train={"use_tuned": False, "epochs": epochs})
    for stage in ("materialize", "prepare", "train", "prune", "quantize", "export", "promote"):
        subprocess.run([str(VENV_BIN / "tfmlops"), "--params", str(workdir / "params.yaml"), stage],
                       cwd=workdir, check=True)
    print(f"scratch pipeline in {workdir}: rerun with --params {workdir / 'params.yaml'}")
    return cfg


def timed(session, url: str, body: bytes) -> float:
    start = time.perf_counter()
    answer = session.post(f"{url}/invocations", data=body,
                          headers={"Content-Type": "application/json"}, timeout=60)
    elapsed = time.perf_counter() - start
    if answer.status_code != 200:
        raise SystemExit(f"{url}: HTTP {answer.status_code}: {answer.text[:500]}")
    return elapsed * 1e3


def summary(times: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)),
            "requests": len(times)}


def measure(cfg, registry, version, encoded, x, tmp: Path, args) -> dict:
    import requests

    from tfmlops.model.artifacts import load_keras3, trained_model_path
    from tfmlops.registry import PRODUCTION, save_keras_flavor
    from tfmlops.serving import local_server as server
    from tfmlops.tracking import tracking_uri

    save_keras_flavor(load_keras3(trained_model_path(cfg)), tmp / "keras_model", x[:1])

    uri = tracking_uri(cfg)
    pyfunc, pyfunc_url = server.start(f"models:/{registry.name}@{PRODUCTION}", uri,
                                      tmp / "pyfunc.log")
    # The Keras flavor pickles the project's registered Keras objects (cloudpickle):
    # it does not load with MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false.
    keras_srv, keras_url = server.start(str(tmp / "keras_model"), uri, tmp / "keras.log",
                                        allow_pickle=True)
    try:
        sessions = {"pyfunc": requests.Session(), "keras": requests.Session()}
        server.wait_ready(pyfunc, pyfunc_url, tmp / "pyfunc.log", session=sessions["pyfunc"])
        server.wait_ready(keras_srv, keras_url, tmp / "keras.log", session=sessions["keras"])
        bodies = {
            "pyfunc": json.dumps({"dataframe_records": [{"pixels": x[0].ravel().tolist()}]}).encode(),
            "keras": json.dumps({"inputs": x[:1].tolist()}).encode(),
            "pyfunc_png": json.dumps({"dataframe_records": [
                {"image": base64.b64encode(encoded[0]).decode()}]}).encode(),
        }
        urls = {"pyfunc": pyfunc_url, "keras": keras_url, "pyfunc_png": pyfunc_url}
        session_of = {"pyfunc": "pyfunc", "keras": "keras", "pyfunc_png": "pyfunc"}
        times = {k: [] for k in bodies}
        for i in range(args.warmup + args.requests):
            for k in bodies:  # alternate: load on the machine hits every server alike
                t = timed(sessions[session_of[k]], urls[k], bodies[k])
                if i >= args.warmup:
                    times[k].append(t)
    finally:
        server.stop(pyfunc)
        server.stop(keras_srv)

    served = registry.tags(version).get("serving.runtime", "?")
    result = {
        "model": f"models:/{registry.name}@{PRODUCTION} (version {version}, runtime {served})",
        "input_shape": list(x.shape[1:]),
        "pyfunc_float": summary(times["pyfunc"]),
        "pyfunc_png": summary(times["pyfunc_png"]),
        "keras_flavor_float": summary(times["keras"]),
    }
    result["keras_over_pyfunc_p50"] = (result["keras_flavor_float"]["p50_ms"]
                                       / result["pyfunc_float"]["p50_ms"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--scratch", action="store_true",
                        help="build a model in a scratch folder instead of using @production")
    parser.add_argument("--epochs", type=int, default=20, help="--scratch training epochs")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    from tfmlops.config import load_config
    from tfmlops.registry import PRODUCTION, Registry
    from tfmlops.serving.formats import load_test_split

    if args.scratch:
        cfg = scratch_pipeline(args.epochs)
    else:
        cfg = load_config(args.params)
    registry = Registry(cfg)
    version = registry.alias(PRODUCTION)
    if version is None:
        raise SystemExit(f"{registry.name} has no @production version in {registry.uri}; run "
                         "`dvc repro` (and promote), or pass --scratch")
    from tfmlops.data.pipeline import load_prepared

    encoded, x, _ = load_test_split(load_prepared(cfg))
    with tempfile.TemporaryDirectory(prefix="tfmlops-serving-bench-") as folder:
        result = measure(cfg, registry, version, encoded, x, Path(folder), args)
    path = save("serving", result)
    print(f"served {result['model']}, one image {result['input_shape']}, "
          f"{args.requests} requests each on 127.0.0.1")
    for k in ("pyfunc_float", "pyfunc_png", "keras_flavor_float"):
        print(f"  {k:<20} p50 {result[k]['p50_ms']:7.2f} ms   p95 {result[k]['p95_ms']:7.2f} ms")
    print(f"keras flavor p50 / pyfunc p50 = {result['keras_over_pyfunc_p50']:.1f}x -> {path}")


if __name__ == "__main__":
    main()
