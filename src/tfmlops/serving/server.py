"""`tfmlops serve`: MLflow's scoring server behind the checks an untrusted client needs.

The URL API is `mlflow models serve`'s (`/invocations`, `/ping`, `/health`,
`/version`): the app is MLflow's own (`mlflow.pyfunc.scoring_server.init`),
wrapped in one ASGI layer that, on `/invocations`, before MLflow parses anything:
- refuses a request with more than one Content-Type header (400): the check here and
  MLflow's parser would otherwise read different ones;
- accepts only the content type the served model documents (`ACCEPTED`: JSON);
  any other one gets 415: CSV (MLflow's CSV parser refuses every body for this
  model's schema, whose `pixels` column is an array) and Parquet (a binary format
  parsed by pyarrow, never needed here) included;
- reads or answers at most `export.serving.max_concurrent_requests` requests at once
  in this process (503 beyond, before the body is read);
- refuses a body over `export.serving.max_body_bytes` with 413, from its
  Content-Length or while it streams in, one that has not arrived in full within
  `body_timeout_s` with 408 (a stalled upload holds its slot and bytes no longer),
  and one with more than `max_json_values` JSON values (413, counted before parsing);
and makes every error answer one line: MLflow's own carry the Python stack
trace (`stack_trace`) and multi-line parser messages; where MLflow's line names a type
and not what to send (`ACTIONABLE`), the line says what to send instead. The limits come from the
model's serving.json and apply per server process (`--workers` multiplies them).
For the project's own pyfunc model, a body that passed these checks goes to its lean
path (`lean.LeanPath`: no pandas, no schema pass, the same answer bytes) when its shape
is one that path takes; every other body, and every other model, goes to MLflow's app.

Pickle deserialization is off unless MLFLOW_ALLOW_PICKLE_DESERIALIZATION says
otherwise: the served model is logged from code and needs none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re

log = logging.getLogger(__name__)

ACCEPTED = ("application/json",)
MODEL_ENV = "TFMLOPS_SERVE_MODEL"  # the downloaded model's folder, for each worker
MESSAGE_LIMIT = 300  # characters of an error message a client gets back
# uvicorn's own bounds, per process: connections held open at once (503 beyond; idle
# keep-alive ones count, so far above the Guard's request cap), seconds an idle keep-alive
# connection stays open, and connections the kernel queues before they are accepted.
UVICORN = {"limit_concurrency": 1024, "timeout_keep_alive": 5, "backlog": 512}
# MLflow's schema check refuses integers in the float `pixels` column ("Can not safely
# convert int64 to float64"): integers there are most often raw 0-255 values.
ACTIONABLE = [(re.compile(r"convert column pixels to type .*convert (u?int\d*) to"),
               "'pixels' holds integers ({0}); the model takes normalized floats, "
               "(value / 255 - mean) / std with serving.json's mean and std (write 0.0, not 0), "
               "or send the picture itself as 'image' (base64 PNG or JPEG)")]


def serve_model(model_uri: str, host: str = "127.0.0.1", port: int = 5000, workers: int = 1) -> None:
    """Download the model once, then run uvicorn (each worker loads it from disk)."""
    import uvicorn

    os.environ.setdefault("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")
    from tfmlops.tracking import import_mlflow

    mlflow = import_mlflow()
    try:
        os.environ[MODEL_ENV] = mlflow.artifacts.download_artifacts(model_uri)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds for a bad URI
        from tfmlops.errors import DataError
        from tfmlops.tracking.retry import first_line

        raise DataError(f"cannot fetch model {model_uri} ({first_line(exc, 200)}); check the "
                        "URI and MLFLOW_TRACKING_URI (the store holding it)") from None
    log.info("serve: %s on http://%s:%d (%d worker%s)", model_uri, host, port, workers,
             "" if workers == 1 else "s")
    uvicorn.run("tfmlops.serving.server:create_app", factory=True, host=host, port=port,
                workers=workers, log_level="warning", **UVICORN)


def create_app():
    """MLflow's scoring app for the model in $TFMLOPS_SERVE_MODEL, guarded by its
    export.serving limits (serving.json)."""
    from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc import load_model, scoring_server

    from tfmlops.config import ServingLimits
    from tfmlops.serving.lean import LeanPath
    from tfmlops.serving.predictor import Predictor

    _big_buffers_unmapped_when_freed()
    model = load_model(os.environ[MODEL_ENV])
    try:
        predictor = model.unwrap_python_model().predictor
    # A model that is not tfmlops' own gets the defaults and MLflow's path alone: another
    # PythonModel has no `predictor`, another flavor (Keras) no python model at all.
    except (AttributeError, MlflowException):
        predictor = None
    if not isinstance(predictor, Predictor):
        return Guard(scoring_server.init(model), ServingLimits())
    timeout_s = MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get()
    return Guard(scoring_server.init(model), predictor.limits, LeanPath(predictor, timeout_s))


def _big_buffers_unmapped_when_freed() -> None:
    """Every malloc of 1 MiB or more in this process gets its own mapping, returned to the
    OS when freed. glibc's default threshold rises to the largest buffer freed, after which
    a request image's decoding buffers (tens of MB) come from the arena of whichever worker
    thread decodes it and stay in the RSS once freed: the more threads have decoded at
    once, the higher the server's memory stays (benchmarks/serving_memory.py). A no-op
    where the C library has no `mallopt` (not glibc)."""
    import ctypes

    m_mmap_threshold = -3  # glibc's malloc.h
    try:
        ctypes.CDLL(None).mallopt(m_mmap_threshold, 2**20)
    except (OSError, AttributeError):
        pass


class Refusal(Exception):
    """An answer the Guard gives instead of the app: status, error code, one-line message."""

    def __init__(self, status: int, code: str, message: str, close: bool = False):
        super().__init__(message)
        self.status, self.code, self.close = status, code, close


class Guard:
    """ASGI middleware on POST /invocations: one content type, at most
    `max_concurrent_requests` at once, the body bounded in bytes, time and JSON values;
    error answers made one line. `limits` is an export.serving (`ServingLimits`)."""

    def __init__(self, app, limits, lean=None):
        self.app, self.limits, self.lean = app, limits, lean
        self.active = 0  # requests this process reads or answers now (one event loop)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/invocations" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        try:
            self._check_headers(scope["headers"])
            if self.active >= self.limits.max_concurrent_requests:
                raise Refusal(503, "TEMPORARILY_UNAVAILABLE", "the server is busy: "
                              f"{self.active} requests are being read or answered, the most one "
                              "server process takes (export.serving.max_concurrent_requests); "
                              "retry shortly")
        except Refusal as refusal:
            return await answer(send, refusal.status, refusal.code, str(refusal), refusal.close)
        self.active += 1
        try:
            body = await self._body(receive)
            if body is None:  # the client left
                return None
            if self.lean is not None and (answered := await self.lean.respond(
                    body, _content_type(scope["headers"]))):
                return await _send_as_mlflow(send, *answered)
            return await self.app(scope, _replay(body, receive), _one_line_errors(send))
        except Refusal as refusal:
            return await answer(send, refusal.status, refusal.code, str(refusal), refusal.close)
        finally:
            self.active -= 1

    def _check_headers(self, raw) -> None:
        types = _content_types(raw)
        if len(types) > 1:
            raise Refusal(400, "BAD_REQUEST", f"the request has {len(types)} Content-Type "
                          "headers; send one: application/json")
        mime = (types[0] if types else "").split(";")[0].strip().lower()
        if mime not in ACCEPTED:
            raise Refusal(415, "UNSUPPORTED_MEDIA_TYPE", f"content type {mime or '(none)'!r} "
                          "is not accepted; send application/json (MLflow's dataframe_records, "
                          "dataframe_split, instances or inputs)")
        length = next((v.decode("latin-1") for k, v in raw if k.lower() == b"content-length"), "")
        if length and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
            raise self._too_big()

    def _too_big(self) -> Refusal:
        return Refusal(413, "REQUEST_LIMIT_EXCEEDED", "the request body is larger than "
                       f"{self.limits.max_body_bytes:,} bytes (export.serving.max_body_bytes); "
                       "send fewer or smaller images")

    async def _body(self, receive) -> bytes | None:
        """The whole body, read within body_timeout_s and checked; None if the client left."""
        cap, seconds = self.limits.max_body_bytes, self.limits.body_timeout_s
        body = bytearray()
        try:
            async with asyncio.timeout(seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    body += message.get("body", b"")
                    if len(body) > cap:
                        raise self._too_big()
                    if not message.get("more_body"):
                        break
        except TimeoutError:
            raise Refusal(408, "DEADLINE_EXCEEDED", f"the request body did not arrive in full "
                          f"within {seconds:g} s (export.serving.body_timeout_s); send it faster, "
                          "or fewer images per request", close=True) from None
        # Every value of a JSON body but the first follows a ',' or opens with '[' or '{':
        # an upper bound on what json.loads would build, found at memchr speed.
        values = body.count(b",") + body.count(b"[") + body.count(b"{")
        if values > self.limits.max_json_values:
            raise Refusal(413, "REQUEST_LIMIT_EXCEEDED", f"the request body holds up to "
                          f"{values:,} JSON values; the server parses at most "
                          f"{self.limits.max_json_values:,} (export.serving.max_json_values): send "
                          "fewer rows per request, or images instead of pixels")
        return bytes(body)


def _content_types(raw) -> list[str]:
    return [v.decode("latin-1") for k, v in raw if k.lower() == b"content-type"]


def _content_type(raw) -> str:
    """The one Content-Type header `_check_headers` let through, as MLflow reads it."""
    return _content_types(raw)[0]


def _replay(body: bytes, receive):
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():  # the body once, then what follows it: the client's disconnect
        return pending.pop() if pending else await receive()

    return replayed


def _one_line_errors(send):
    """`send` with an error answer's body replaced by {error_code, message: its first line}."""
    start, chunks = None, []

    async def sending(message):
        nonlocal start
        if message["type"] == "http.response.start" and message["status"] >= 400:
            start = message
            return None
        if start is None or message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        code, text = _error_of(b"".join(chunks), start["status"])
        return await answer(send, start["status"], code, text)

    return sending


async def _send_as_mlflow(send, status: int, body: bytes) -> None:
    """The lean path's answer, sent as MLflow's app sends it: an error made one line as
    `_one_line_errors` makes MLflow's."""
    if status >= 400:
        return await answer(send, status, *_error_of(body, status))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()),
                            (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _error_of(body: bytes, status: int) -> tuple[str, str]:
    try:
        data = json.loads(body)
        code, text = str(data.get("error_code", "")), str(data.get("message", ""))
    except (ValueError, AttributeError):
        code, text = "", body.decode("utf-8", "replace")
    code = code or ("BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
    line = next((s.strip() for s in text.splitlines() if s.strip()), f"HTTP {status}")
    for pattern, instead in ACTIONABLE:
        if found := pattern.search(line):
            line = instead.format(*found.groups())
    return code, line[:MESSAGE_LIMIT] + ("..." if len(line) > MESSAGE_LIMIT else "")


async def answer(send, status: int, code: str, message: str, close: bool = False) -> None:
    """A one-line JSON error answer; `close` ends the connection after it (uvicorn reads the
    Connection header), for a request whose body is abandoned half-read."""
    body = json.dumps({"error_code": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})
