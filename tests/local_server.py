"""`tfmlops serve` on 127.0.0.1, in its own process group: start, wait, stop.

What the README's serving command does, as the serving tests and
`benchmarks/serving.py` run it (test and benchmark support, not in the package). Its
own process group: the uvicorn workers it spawns stop with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

TFMLOPS = Path(sys.executable).parent / "tfmlops"  # the one of this environment


def start(model_uri: str, tracking_uri: str, log: Path, *, allow_pickle: bool = False,
          env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """(the server process, its URL); `log` takes its output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = dict(os.environ if env is None else env)
    env = {**base, "PATH": f"{TFMLOPS.parent}{os.pathsep}{base.get('PATH', '')}",
           "MLFLOW_TRACKING_URI": tracking_uri,
           "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": str(allow_pickle).lower()}
    proc = subprocess.Popen(
        [str(TFMLOPS), "serve", "-m", model_uri, "-H", "127.0.0.1", "-p", str(port)],
        cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 300.0,
               session=None) -> None:
    """Until `/ping` answers 200; RuntimeError with the log's tail if it dies or times out."""
    import requests

    get = (session or requests).get
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server {url} died:\n{log.read_text()[-3000:]}")
        try:  # a server that accepts but is slow to answer (a loaded machine) is still starting
            if get(f"{url}/ping", timeout=10).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server {url} did not start in {timeout_s:g} s:\n"
                       f"{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole group, SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def raw_post(port: int, headers: list[str], body: bytes = b"") -> socket.socket:
    """A raw POST /invocations on 127.0.0.1:`port` with these header lines and (the start
    of) its body, sent: a client that may stall, as no HTTP library lets one."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = "\r\n".join(["POST /invocations HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""])
    sock.sendall(head.encode() + body)
    return sock


def raw_answer(sock: socket.socket) -> tuple[int, dict]:
    """(status, JSON body) of the one answer on `sock` (its Content-Length, or until the
    server closes the connection)."""
    import json

    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    while length is None or len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(head.split()[1]), json.loads(rest[:length] if length is not None else rest)
