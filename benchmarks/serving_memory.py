"""Serving memory under 16-bit images: 8 concurrent requests of four 4096x4096 16-bit PNGs.

Builds a tiny served model the way export does (a 16x16x1 Keras model -> ONNX,
serving.json with export.serving's default caps, `serving.mlflow_model.save_serving_model`:
the pyfunc folder carries the importable tfmlops package as its code), serves it
on 127.0.0.1, warms it with one small request, then sends 8 requests at once,
each of four 16-bit 4096x4096 PNGs of zeros (about 44 KB each as base64), while
the server's process tree's RSS (sum over processes, psutil) is sampled every 10 ms.
Prints the baseline, the peak, the growth and the answers' status codes; writes
reports/benchmarks/serving_memory_<server>.json.

    .venv/bin/python benchmarks/serving_memory.py --server tfmlops
    .venv/bin/python benchmarks/serving_memory.py --server mlflow   # mlflow models serve
    # the code before the fix: a checkout of it first on PYTHONPATH (the model carries it)
    PYTHONPATH=/tmp/base/src .venv/bin/python benchmarks/serving_memory.py --server mlflow
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import save, tree_rss  # noqa: E402

VENV_BIN = Path(sys.executable).parent


def build_model(folder: Path) -> Path:
    """A served pyfunc model folder (ONNX runtime), as export saves it."""
    import keras
    from PIL import Image

    from tfmlops.stages.export import mlflow_model
    from tfmlops.stages.export.formats import to_onnx, write_serving_config

    out = folder / "export"
    out.mkdir()
    inputs = keras.Input((16, 16, 1))
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(
        keras.layers.Flatten()(inputs)))
    to_onnx(model, out / "model.onnx", (16, 16, 1), 17)
    prepared = SimpleNamespace(classes=[str(i) for i in range(10)], image_size=16, channels=1,
                               mean=[0.5], std=[0.25], stored_size=None)
    write_serving_config(out, {"runtime": "onnx", "file": "model.onnx"}, prepared)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(buf, "PNG")
    example = mlflow_model.request_example(buf.getvalue())
    mlflow_model.save_serving_model(out, "model.onnx", example, folder / "model")
    return folder / "model"


def png16(side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((side, side), np.uint16)).save(buf, "PNG")
    return buf.getvalue()


def start(server: str, model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = ([str(VENV_BIN / "tfmlops"), "serve", "-m", str(model), "-p", str(port)]
               if server == "tfmlops" else
               [str(VENV_BIN / "mlflow"), "models", "serve", "-m", str(model), "--env-manager",
                "local", "-h", "127.0.0.1", "-p", str(port)])
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def measure(server: str, clients: int, images: int, side: int) -> dict:
    import psutil
    import requests

    with tempfile.TemporaryDirectory(prefix="tfmlops-serving-memory-") as tmp:
        model = build_model(Path(tmp))
        proc, url = start(server, model, Path(tmp) / "server.log")
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if requests.get(f"{url}/ping", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((Path(tmp) / "server.log").read_text()[-3000:])
                time.sleep(0.5)
            small = base64.b64encode(png16(16)).decode()
            warm = requests.post(f"{url}/invocations", json={"dataframe_records": [
                {"image": small}]}, timeout=60)
            assert warm.status_code == 200, warm.text
            body = json.dumps({"dataframe_records": [
                {"image": base64.b64encode(png16(side)).decode()}] * images}).encode()
            tree = psutil.Process(proc.pid)
            time.sleep(1.0)
            baseline = tree_rss(tree)
            peak, done = baseline, threading.Event()

            def sample():
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, tree_rss(tree))
                    time.sleep(0.01)

            answers: list[tuple[int, str]] = []

            def client():
                r = requests.post(f"{url}/invocations", data=body, timeout=600,
                                  headers={"Content-Type": "application/json"})
                answers.append((r.status_code, r.text[:200]))

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - started
            time.sleep(0.5)
            done.set()
            sampler.join()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    return {"server": server, "clients": clients, "images_per_request": images, "side": side,
            "body_bytes": len(body), "baseline_mb": round(baseline / 2**20, 1),
            "peak_mb": round(peak / 2**20, 1), "growth_mb": round((peak - baseline) / 2**20, 1),
            "seconds": round(seconds, 2),
            "status_codes": sorted(code for code, _ in answers),
            "first_refusal": next((text for code, text in answers if code != 200), None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("tfmlops", "mlflow"), default="tfmlops")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--side", type=int, default=4096)
    args = parser.parse_args()
    import tfmlops

    result = measure(args.server, args.clients, args.images, args.side)
    result["tfmlops_code"] = str(Path(tfmlops.__file__).parent)
    path = save(f"serving_memory_{args.server}", result)
    print(f"{args.server} serve ({result['tfmlops_code']}): {args.clients} requests at once of "
          f"{args.images} 16-bit {args.side}x{args.side} PNGs ({result['body_bytes']:,} bytes "
          f"each): server tree RSS {result['baseline_mb']} MB -> peak {result['peak_mb']} MB "
          f"(+{result['growth_mb']} MB) in {result['seconds']} s; answers "
          f"{result['status_codes']} -> {path}")
    if result["first_refusal"]:
        print(f"  first refusal: {result['first_refusal']}")


if __name__ == "__main__":
    main()
