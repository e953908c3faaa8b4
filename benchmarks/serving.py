"""Serving: the promoted pyfunc model vs the plain MLflow Keras flavor, over HTTP,
and the pyfunc's requests/s with 8 concurrent clients against 1.

Two `mlflow models serve --env-manager local` servers on 127.0.0.1 (free ports,
stopped after): the registered model's @production version (ONNX Runtime or LiteRT
behind the pyfunc) and the same trained Keras model logged with the plain Keras
flavor (`Model.predict` per request). Each answers the same single-image float
request; requests alternate between the two servers (so machine load hits both
alike), `--requests` timed per server after a warm-up, one keep-alive connection
each. Also timed: the pyfunc with a base64 PNG (decoding and preprocessing in the
server). Then the pyfunc alone: requests/s for `--seconds` with 1 client, then with
8 clients at once (one connection each; the server runs MLflow's default uvicorn
workers, one per core). The clients share this process and its 2 cores with the
server: the concurrent figure is what one machine does, not the server's ceiling.
Prints the figures, writes reports/benchmarks/serving.json.

    .venv/bin/python benchmarks/serving.py --scratch      # runs the stages first (minutes)
    .venv/bin/python benchmarks/serving.py                # uses params.yaml's @production
    .venv/bin/python benchmarks/serving.py --repo PATH    # a reproduced project (run.py)
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


def requests_per_s(url: str, body: bytes, clients: int, seconds: float) -> dict:
    """Requests/s of `clients` concurrent clients (one keep-alive connection each),
    each sending requests back to back for `seconds`."""
    import threading

    import requests

    counts = [0] * clients
    start = time.perf_counter()
    stop_at = start + seconds

    def client(i: int) -> None:
        with requests.Session() as session:
            timed(session, url, body)  # connect before the clock matters
            while time.perf_counter() < stop_at:
                timed(session, url, body)
                counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {"clients": clients, "requests": sum(counts), "seconds": round(elapsed, 2),
            "requests_per_s": round(sum(counts) / elapsed, 1)}


def summary(times: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)),
            "requests": len(times)}


def save_keras_flavor(model, path: Path, example) -> None:
    """The baseline: `model` saved with MLflow's plain Keras flavor (tfmlops never serves it)."""
    from tfmlops.tracking import import_mlflow

    mlflow = import_mlflow()  # first: it bounds MLflow's HTTP retries
    from mlflow.models import infer_signature

    signature = infer_signature(example, model.predict(example, verbose=0))
    mlflow.tensorflow.save_model(model, str(path), signature=signature)


def measure(cfg, registry, version, encoded, x, tmp: Path, args) -> dict:
    import requests

    from tfmlops.model.trained import load_keras3, trained_model_path
    from tfmlops.registry import PRODUCTION
    from tfmlops.tracking import tracking_uri

    sys.path.insert(0, str(ROOT / "tests"))  # its server helper, shared with the serving tests
    import local_server as server

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
        server.stop(keras_srv)  # the concurrency figures: the pyfunc server alone
        concurrency = {n: requests_per_s(pyfunc_url, bodies["pyfunc"], n, args.seconds)
                       for n in (1, 8)}
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
    result["keras_over_pyfunc_p50"] = round(result["keras_flavor_float"]["p50_ms"]
                                             / result["pyfunc_float"]["p50_ms"], 2)
    result["pyfunc_1_client"] = concurrency[1]
    result["pyfunc_8_clients"] = concurrency[8]
    result["eight_over_one_client"] = round(concurrency[8]["requests_per_s"]
                                            / concurrency[1]["requests_per_s"], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--repo", type=Path, help="a reproduced project (its params.yaml, "
                        "its store's @production); overrides --params")
    parser.add_argument("--scratch", action="store_true",
                        help="build a model in a scratch folder instead of using @production")
    parser.add_argument("--epochs", type=int, default=20, help="--scratch training epochs")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="duration of each requests/s measurement (1 and 8 clients)")
    parser.add_argument("--quick", action="store_true", help="30 requests, 3 s per rate")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.warmup, args.seconds = 30, 5, 3.0
    if args.repo is not None:
        os.chdir(args.repo)  # params' paths and the store are the repo's
        args.params = str(args.repo.resolve() / "params.yaml")
    result = run(args)
    path = save("serving", result)
    print(f"served {result['model']}, one image {result['input_shape']}, "
          f"{args.requests} requests each on 127.0.0.1")
    for k in ("pyfunc_float", "pyfunc_png", "keras_flavor_float"):
        print(f"  {k:<20} p50 {result[k]['p50_ms']:7.2f} ms   p95 {result[k]['p95_ms']:7.2f} ms")
    print(f"keras flavor p50 / pyfunc p50 = {result['keras_over_pyfunc_p50']:.1f}x")
    one, eight = result["pyfunc_1_client"], result["pyfunc_8_clients"]
    print(f"pyfunc requests/s: 1 client {one['requests_per_s']}, 8 clients "
          f"{eight['requests_per_s']} = {result['eight_over_one_client']}x -> {path}")


def run(args) -> dict:
    from tfmlops.config import load_config
    from tfmlops.data.stored_split import StoredSplit
    from tfmlops.registry import PRODUCTION, Registry

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

    encoded, x, _ = StoredSplit.of(load_prepared(cfg)).arrays()
    with tempfile.TemporaryDirectory(prefix="tfmlops-serving-bench-") as folder:
        return measure(cfg, registry, version, encoded, x, Path(folder), args)


if __name__ == "__main__":
    main()
