"""Serving: `tfmlops serve`'s lean path against the same command at a base revision and
`mlflow models serve`, on one registered model, one server process each.

Three servers on 127.0.0.1, each `--workers 1` (free ports, stopped after): `tfmlops
serve` from this checkout, `tfmlops serve` from `--base-src` (a checkout's src of the
revision before, e.g. `git worktree add /tmp/base b0a5723`), and `mlflow models serve
--env-manager local`, on `models:/<name>@production` of one store (the base server on a
download of it whose serving.json holds only the limits the base revision knows). First every
server gets the same bodies (each input format, images and pixels, several rows) and
their 200 answers must be byte-identical. Then, in `--rounds` rounds, for each body kind
(`--bodies`), the servers in turn in short windows (the order rotates each round, so
load from outside hits all alike): `--requests` sequential requests on one keep-alive
connection, then 1 and 8 concurrent keep-alive clients for `--seconds` each
(a raw-socket client, one connection per client thread, in this process). p50 over all the
sequential requests, requests/s over all the windows, and the server process tree's
CPU time per request under 8 clients (psutil; what load from outside changes least);
prints new / base and new / mlflow ratios, writes reports/benchmarks/serving_lean.json.

The model: `--params` names a project whose store has @production, or (default) one is
built once in `--workdir` as the serving tests build theirs (real digits at 16 px, the
tiny CNN fitted a few epochs, exported to ONNX/LiteRT and registered, promoted).

    git worktree add /tmp/base b0a5723
    .venv/bin/python benchmarks/serving_lean.py --base-src /tmp/base/src --workdir /tmp/lean
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # the serving tests' server helper and tiny recipe
VENV_BIN = Path(sys.executable).parent


def built_model(workdir: Path):
    """The config of a project in `workdir` whose store holds a promoted served model
    (built the first time, as tests/conftest.py's exported_digits fixture builds it)."""
    import yaml

    from tfmlops.config import load_config

    params = workdir / "params.yaml"
    if not (workdir / "promoted").exists():
        from conftest import LOOSE_GATE, save_tiny_trained, tiny_params  # noqa: I001
        from tfmlops.artifacts import REGISTERED
        from tfmlops.stages import export, materialize, prepare, promote

        workdir.mkdir(parents=True, exist_ok=True)
        params.write_text(yaml.safe_dump(tiny_params(workdir, promote={"gate": LOOSE_GATE}),
                                         sort_keys=False))
        cfg = load_config(params)
        materialize.run(cfg)
        prepare.run(cfg)
        save_tiny_trained(cfg)
        export.run(cfg)
        version = int(json.loads((Path(cfg.paths.export) / REGISTERED).read_text())["version"])
        assert promote.run(cfg, version=version)["outcome"] == "promoted"
        (workdir / "promoted").touch()
    return load_config(params)


def request_bodies(cfg) -> dict[str, bytes]:
    """Every input format, images and pixels: the byte-identity check's bodies. `png` and
    `pixels` are the timed ones (one image, as the README's request)."""
    from tfmlops.artifacts import SERVING

    png = sorted(Path(cfg.paths.builtin).rglob("*.png"))[:4]
    images = [base64.b64encode(p.read_bytes()).decode() for p in png]
    config = json.loads((Path(cfg.paths.export) / SERVING).read_text())
    n = config["image_size"] ** 2 * config["channels"]
    pixels = [np.random.default_rng(i).normal(size=n).tolist() for i in range(3)]
    bodies = {
        "png": {"dataframe_records": [{"image": images[0]}]},
        "pixels": {"dataframe_records": [{"pixels": pixels[0]}]},
        "png_4_rows": {"dataframe_records": [{"image": i} for i in images]},
        "pixels_3_rows": {"dataframe_records": [{"pixels": p} for p in pixels]},
        "split_png": {"dataframe_split": {"columns": ["image"], "data": [[i] for i in images]}},
        "split_pixels": {"dataframe_split": {"columns": ["pixels"], "data": [[p] for p in pixels]}},
        "split_with_index": {"dataframe_split": {"index": [7], "columns": ["image"],
                                                 "data": [[images[1]]]}},
        "instances": {"instances": {"image": images[2]}},
        "inputs": {"inputs": {"image": images[3]}},
        "with_params": {"dataframe_records": [{"image": images[0]}], "params": {}},
    }
    return {k: json.dumps(v).encode() for k, v in bodies.items()}


class Client:
    """One keep-alive HTTP/1.1 connection sending one prepared POST /invocations: raw
    socket, so the client's own CPU per request (shared with the servers on this machine)
    stays a small part of what is measured; http.client parses each answer's headers with
    the email package."""

    def __init__(self, url: str, body: bytes):
        host, port = url.rsplit("/", 1)[1].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.request = (f"POST /invocations HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
                        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        self.pending = b""

    def post(self) -> tuple[int, bytes]:
        """(status, body) of one request (every answer here carries a Content-Length)."""
        self.sock.sendall(self.request)
        data = self.pending
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv()
        head, rest = data[:end], data[end + 4:]
        length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
        while len(rest) < length:
            rest += self._recv()
        self.pending = rest[length:]
        return int(head.split(b" ", 2)[1]), rest[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def sequential_times(url: str, body: bytes, requests: int) -> list[float]:
    """Milliseconds of `requests` sequential requests on one keep-alive connection."""
    client, times = Client(url, body), []
    for i in range(requests + 3):  # 3 warm-up requests on the new connection
        start = time.perf_counter()
        status, text = client.post()
        if status != 200:
            raise SystemExit(f"{url}: HTTP {status}: {text[:300]!r}")
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    client.close()
    return times


def requests_in(url: str, body: bytes, clients: int, seconds: float) -> tuple[int, float]:
    """(requests answered, seconds) of `clients` threads, one keep-alive connection each,
    sending back to back for `seconds`."""
    counts, failures = [0] * clients, []
    ready = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        conn = Client(url, body)
        conn.post()  # connected before the clock starts
        ready.wait()
        while time.perf_counter() < stop_at:
            status, _ = conn.post()
            if status != 200:
                failures.append(status)
                return
            counts[i] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at = time.perf_counter() + 3600
    ready.wait()
    start = time.perf_counter()
    stop_at = start + seconds
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{url}: HTTP {failures[0]} under {clients} clients")
    return sum(counts), time.perf_counter() - start


def base_copy(model_uri: str, store: str, base_src: Path, folder: Path) -> Path:
    """The registered model downloaded into `folder`, its serving.json limits cut to those
    the base revision knows (its ServingLimits refuses a key it does not know; the limits
    added since are not enforced there anyway)."""
    import shutil

    from tfmlops.artifacts import SERVING
    from tfmlops.tracking import import_mlflow

    shutil.rmtree(folder, ignore_errors=True)
    import_mlflow().artifacts.download_artifacts(model_uri, dst_path=str(folder),
                                                 tracking_uri=store)
    known = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from tfmlops.config import ServingLimits; "
         "print(json.dumps(list(ServingLimits.__struct_fields__)))"],
        env={**os.environ, "PYTHONPATH": str(base_src)}, capture_output=True, text=True,
        check=True).stdout)
    config_file = folder / "artifacts" / SERVING
    config = json.loads(config_file.read_text())
    config["limits"] = {k: v for k, v in config.get("limits", {}).items() if k in known}
    config_file.write_text(json.dumps(config))
    return folder


def start_servers(model_uri: str, store: str, base_src: Path, folder: Path) -> dict:
    import local_server
    from conftest import free_port

    new_env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    base_env = {**os.environ, "PYTHONPATH": str(base_src)}
    base_model = str(base_copy(model_uri, store, base_src, folder / "base_model"))
    servers = {"new": local_server.start(model_uri, store, folder / "new.log", env=new_env),
               "base": local_server.start(base_model, store, folder / "base.log", env=base_env)}
    port = free_port()
    env = {**new_env, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "MLFLOW_TRACKING_URI": store, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    with (folder / "mlflow.log").open("w") as log:
        proc = subprocess.Popen(
            [str(VENV_BIN / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager",
             "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    servers["mlflow"] = (proc, f"http://127.0.0.1:{port}")
    return servers


def same_answers(urls: dict[str, str], bodies: dict[str, bytes]) -> dict[str, str]:
    """{body name: "identical" or what differed}; every server answers every body."""
    found = {}
    for name, body in bodies.items():
        answers = {}
        for server, url in urls.items():
            client = Client(url, body)
            answers[server] = client.post()
            client.close()
        distinct = set(answers.values())
        found[name] = "identical" if len(distinct) == 1 else "DIFFERENT: " + "; ".join(
            f"{s} {a[0]} {a[1][:120]!r}" for s, a in answers.items())
    return found


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far."""
    import psutil

    total = 0.0
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def measure(urls: dict[str, str], pids: dict[str, int], bodies: dict[str, bytes], args) -> dict:
    """Short windows, the servers in turn (the order rotating each round), so that load
    from outside hits every server alike: p50 over all sequential requests; requests/s as
    all requests answered over all seconds of the windows; the server tree's CPU time per
    request under 8 clients (what load from outside changes least)."""
    names = list(urls)
    times = {(s, b): [] for s in names for b in args.bodies}
    done = {(s, b, n): [0, 0.0] for s in names for b in args.bodies for n in (1, 8)}
    cpu = {(s, b): 0.0 for s in names for b in args.bodies}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for kind in args.bodies:
            for server in order:
                times[server, kind] += sequential_times(urls[server], bodies[kind], args.requests)
            for clients in (1, 8):
                for server in order:
                    before = tree_cpu_s(pids[server])
                    count, seconds = requests_in(urls[server], bodies[kind], clients, args.seconds)
                    if clients == 8:
                        cpu[server, kind] += tree_cpu_s(pids[server]) - before
                    done[server, kind, clients][0] += count
                    done[server, kind, clients][1] += seconds
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    return {s: {b: {"p50_ms": round(float(np.percentile(times[s, b], 50)), 3),
                    **{f"rps_{n}": round(done[s, b, n][0] / done[s, b, n][1], 1) for n in (1, 8)},
                    "cpu_us_per_request_8": round(cpu[s, b] / done[s, b, 8][0] * 1e6, 1)}
                for b in args.bodies} for s in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-src", type=Path, required=True,
                        help="the src folder of a checkout of the revision before")
    parser.add_argument("--params", type=Path, help="a project whose store has @production "
                        "(default: build one in --workdir)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tfmlops-serving-lean"),
                        help="where the default model is built once and kept")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=50,
                        help="sequential requests per server, body and round")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="each requests/s window (per server, body, clients and round)")
    parser.add_argument("--bodies", nargs="+", default=["png", "pixels"], choices=["png", "pixels"])
    args = parser.parse_args()

    import conftest  # noqa: F401 - first: importing it clears MLFLOW_* variables from os.environ
    import local_server
    from tfmlops.config import load_config
    from tfmlops.registry import PRODUCTION
    from tfmlops.tracking import tracking_uri

    if args.params:
        os.chdir(args.params.resolve().parent)  # params' paths and the store are the project's
    cfg = load_config(args.params) if args.params else built_model(args.workdir)
    model_uri = f"models:/{cfg.promote.registered_model}@{PRODUCTION}"
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri(cfg)  # the registry the URI names
    bodies = request_bodies(cfg)
    logs = args.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    servers = start_servers(model_uri, tracking_uri(cfg), args.base_src.resolve(), logs)
    try:
        for name, (proc, url) in servers.items():
            local_server.wait_ready(proc, url, logs / f"{name}.log", timeout_s=300)
        urls = {name: url for name, (_, url) in servers.items()}
        identity = same_answers(urls, bodies)
        figures = measure(urls, {name: proc.pid for name, (proc, _) in servers.items()},
                          bodies, args)
    finally:
        for proc, _ in servers.values():
            local_server.stop(proc)
    result = {"model": model_uri, "base_src": str(args.base_src), "answers": identity,
              "figures": figures, "rounds": args.rounds, "seconds": args.seconds,
              "requests": args.requests}
    ratios = {}
    for kind in args.bodies:
        new, base, ml = (figures[s][kind] for s in ("new", "base", "mlflow"))
        ratios[kind] = {"rps_8_new_over_base": round(new["rps_8"] / base["rps_8"], 2),
                        "rps_1_new_over_base": round(new["rps_1"] / base["rps_1"], 2),
                        "p50_base_over_new": round(base["p50_ms"] / new["p50_ms"], 2),
                        "rps_8_new_over_mlflow": round(new["rps_8"] / ml["rps_8"], 2),
                        "cpu_per_request_base_over_new": round(
                            base["cpu_us_per_request_8"] / new["cpu_us_per_request_8"], 2)}
    result["ratios"] = ratios
    path = save("serving_lean", result)
    for name, verdict in identity.items():
        print(f"  answers to {name:<17} {verdict}")
    for kind in args.bodies:
        for server in ("new", "base", "mlflow"):
            f = figures[server][kind]
            print(f"{kind:<7} {server:<7} p50 {f['p50_ms']:6.2f} ms   1 client {f['rps_1']:7.1f} "
                  f"req/s   8 clients {f['rps_8']:7.1f} req/s, server CPU "
                  f"{f['cpu_us_per_request_8']:7.1f} us/request")
        r = ratios[kind]
        print(f"{kind:<7} new/base: 8 clients {r['rps_8_new_over_base']}x, 1 client "
              f"{r['rps_1_new_over_base']}x, p50 {r['p50_base_over_new']}x faster, server CPU "
              f"per request {r['cpu_per_request_base_over_new']}x less; new/mlflow 8 clients "
              f"{r['rps_8_new_over_mlflow']}x")
    print(f"-> {path}")
    if any(v != "identical" for v in identity.values()):
        raise SystemExit("the servers' answers differ (above)")


if __name__ == "__main__":
    main()
