"""`tfmlops serve`'s Guard under real uvicorn on 127.0.0.1, spoken to over raw sockets.

The Guard wraps a trivial ASGI app here (it answers with what it saw: the body's
length and the Content-Type a Starlette request reads, the first), started with the
uvicorn settings `serve_model` passes: the slow-upload and concurrency mechanics
without a model. tests/integration/test_serving.py checks the same limits through
`tfmlops serve` and a registered model.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from local_server import raw_answer, raw_post

pytestmark = pytest.mark.slow  # real uvicorn servers: outside the fast tier

# The server process: the Guard, with export.serving limits from argv, around an app that
# reads the whole body and answers {"bytes": n, "content_type": the first one}.
SERVER = """
import json, sys
import uvicorn
from tfmlops.config import ServingLimits
from tfmlops.serving.server import UVICORN, Guard

async def echo(scope, receive, send):
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    types = [v for k, v in scope["headers"] if k == b"content-type"]
    body = json.dumps({"bytes": size, "content_type": (types or [b""])[0].decode()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

port, limits = int(sys.argv[1]), ServingLimits(**json.loads(sys.argv[2]))
uvicorn.run(Guard(echo, limits), host="127.0.0.1", port=port, log_level="warning",
            lifespan="off", **UVICORN)
"""


class Server:
    def __init__(self, limits: dict):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(self.port),
                                      json.dumps(limits)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the guarded server did not start in 60 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def guarded(request):
    server = Server(request.param)
    yield server
    server.stop()


def post(port: int, body: bytes, *types: str) -> tuple[int, dict]:
    sock = raw_post(port, [f"Content-Type: {t}" for t in types] +
                    [f"Content-Length: {len(body)}"], body)
    with sock:
        return raw_answer(sock)


@pytest.mark.parametrize("guarded", [{}], indirect=True)
def test_a_second_content_type_header_gets_a_one_line_400(guarded):
    """The Guard checked the last Content-Type while Starlette (MLflow's parser) reads the
    first: Parquet first, JSON second reached pyarrow. More than one is refused."""
    status, body = post(guarded.port, b"{}", "application/json")
    assert (status, body["content_type"]) == (200, "application/json")
    for types in (("application/vnd.apache.parquet", "application/json"),
                  ("application/json", "application/json")):
        status, body = post(guarded.port, b"PAR1", *types)
        assert status == 400, body
        assert body == {"error_code": "BAD_REQUEST", "message": "the request has 2 Content-Type "
                        "headers; send one: application/json"}


@pytest.mark.parametrize("guarded", [{"max_json_values": 1000}], indirect=True)
def test_a_body_of_too_many_json_values_gets_a_413_before_parsing(guarded):
    """A float array costs MLflow's parsing ~120 bytes a value: the values are counted by
    their separators first, and a body over export.serving.max_json_values refused."""
    def pixels(n):
        return json.dumps({"dataframe_records": [{"pixels": [0] * n}]}).encode()

    assert post(guarded.port, pixels(990), "application/json")[0] == 200
    status, body = post(guarded.port, pixels(1000), "application/json")
    assert status == 413, body
    assert body["message"] == ("the request body holds up to 1,003 JSON values; the server "
                               "parses at most 1,000 (export.serving.max_json_values): send fewer "
                               "rows per request, or images instead of pixels")


def tree_rss(pid: int) -> int:
    """RSS of the server process and its children (uvicorn starts none here)."""
    import psutil

    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


SLOW = {"max_body_bytes": 8 * 2**20, "max_concurrent_requests": 4, "body_timeout_s": 2.0}


@pytest.mark.parametrize("guarded", [SLOW], indirect=True)
def test_stalled_uploads_get_408_or_503_and_the_servers_memory_stays_bounded(guarded):
    """16 clients each declare an 8 MiB body, send 6 MiB of it and stall (a slowloris).
    Before, every one was read into memory and held unanswered (28 s and counting in the
    review: 40 of them took the server from 26 to 353 MB). Now 4 are read
    (max_concurrent_requests), each until body_timeout_s (2 s) -> 408, the other 12 get
    503 at once, and the server tree's peak RSS stays within idle x 1.2 + 4 x 8 MiB."""
    port, clients, sent = guarded.port, 16, 6 * 2**20
    assert post(port, b"{}", "application/json")[0] == 200  # warm
    time.sleep(0.5)
    idle = peak = tree_rss(guarded.proc.pid)
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(guarded.proc.pid))
            time.sleep(0.02)

    answers: list[tuple[int, float]] = []

    def stall():
        started = time.monotonic()
        sock = raw_post(port, ["Content-Type: application/json",
                               f"Content-Length: {SLOW['max_body_bytes']}"], b"[" * sent)
        with sock:
            status, _ = raw_answer(sock)
        answers.append((status, time.monotonic() - started))

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=stall) for _ in range(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        done.set()
        sampler.join()
    bound = idle * 1.2 + SLOW["max_concurrent_requests"] * SLOW["max_body_bytes"]
    print(f"server tree RSS: idle {idle / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB, "
          f"bound {bound / 2**20:.1f} MB")
    assert len(answers) == clients, f"{clients - len(answers)} stalled uploads never answered"
    assert peak <= bound, (idle, peak, bound)
    assert sorted(s for s, _ in answers) == [408] * 4 + [503] * 12, answers
    late = [round(t, 2) for s, t in answers if s == 408 and not 2.0 <= t <= 2.0 + 3.0]
    assert not late, f"408 outside the 2 s deadline (+3 s slack): {late}"
    assert post(port, b"{}", "application/json")[0] == 200  # and it keeps serving


@pytest.mark.parametrize("flavor", ["python_model", "keras"])
def test_a_model_that_is_not_tfmlops_own_is_guarded_with_the_default_limits(flavor, tmp_path,
                                                                            monkeypatch):
    """`tfmlops serve` of another model (the serving benchmark's plain Keras flavor, a
    PythonModel of one's own) serves it under the default limits instead of failing to
    start (mlflow's unwrap_python_model raises MlflowException for a non-pyfunc flavor)."""
    import mlflow
    import numpy as np

    from tfmlops.config import ServingLimits
    from tfmlops.serving import server

    path = tmp_path / "model"
    if flavor == "keras":
        import keras

        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        mlflow.tensorflow.save_model(model, str(path))
        monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")
    else:
        class Doubled(mlflow.pyfunc.PythonModel):
            def predict(self, context, model_input, params=None):
                return np.asarray(model_input) * 2

        mlflow.pyfunc.save_model(str(path), python_model=Doubled())
    monkeypatch.setenv(server.MODEL_ENV, str(path))
    app = server.create_app()
    assert isinstance(app, server.Guard) and app.limits == ServingLimits()
