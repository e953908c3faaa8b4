"""`tfmlops serve`: MLflow's scoring server behind the checks an untrusted client needs.

The URL API is `mlflow models serve`'s (`/invocations`, `/ping`, `/health`,
`/version`): the app is MLflow's own (`mlflow.pyfunc.scoring_server.init`),
wrapped in one ASGI layer that, on `/invocations`, before MLflow parses anything:
- accepts only the content type the served model documents (`ACCEPTED`: JSON);
  any other one gets 415: CSV (MLflow's CSV parser refuses every body for this
  model's schema, whose `pixels` column is an array) and Parquet (a binary format
  parsed by pyarrow, never needed here) included;
- refuses a body over `export.serving.max_body_bytes` (from the model's
  serving.json) with 413, from its Content-Length or while it streams in;
and makes every error answer one line: MLflow's own carry the Python stack
trace (`stack_trace`) and multi-line parser messages.

Pickle deserialization is off unless MLFLOW_ALLOW_PICKLE_DESERIALIZATION says
otherwise: the served model is logged from code and needs none.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

ACCEPTED = ("application/json",)
MODEL_ENV = "TFMLOPS_SERVE_MODEL"  # the downloaded model's folder, for each worker
MESSAGE_LIMIT = 300  # characters of an error message a client gets back


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
                workers=workers, log_level="warning")


def create_app():
    """MLflow's scoring app for the model in $TFMLOPS_SERVE_MODEL, guarded by its
    export.serving.max_body_bytes (serving.json)."""
    from mlflow.pyfunc import load_model, scoring_server

    from tfmlops.config import ServingLimits

    model = load_model(os.environ[MODEL_ENV])
    try:
        max_body = int(model.unwrap_python_model().predictor.limits.max_body_bytes)
    except AttributeError:  # a model that is not tfmlops' own: the default
        max_body = ServingLimits().max_body_bytes
    return Guard(scoring_server.init(model), max_body)


class Guard:
    """ASGI middleware: content type and body size checked, error answers made one line."""

    def __init__(self, app, max_body: int):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/invocations" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        mime = headers.get("content-type", "").split(";")[0].strip().lower()
        if mime not in ACCEPTED:
            return await answer(send, 415, "UNSUPPORTED_MEDIA_TYPE", f"content type {mime or '(none)'!r} "
                                "is not accepted; send application/json (MLflow's dataframe_records, "
                                "dataframe_split, instances or inputs)")
        too_big = (f"the request body is larger than {self.max_body:,} bytes "
                   "(export.serving.max_body_bytes); send fewer or smaller images")
        length = headers.get("content-length", "")
        if length and (not length.isdigit() or int(length) > self.max_body):
            return await answer(send, 413, "REQUEST_LIMIT_EXCEEDED", too_big)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return await answer(send, 413, "REQUEST_LIMIT_EXCEEDED", too_big)
            if not message.get("more_body"):
                break
        return await self.app(scope, _replay(bytes(body), receive), _one_line_errors(send))


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


def _error_of(body: bytes, status: int) -> tuple[str, str]:
    try:
        data = json.loads(body)
        code, text = str(data.get("error_code", "")), str(data.get("message", ""))
    except (ValueError, AttributeError):
        code, text = "", body.decode("utf-8", "replace")
    code = code or ("BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
    line = next((s.strip() for s in text.splitlines() if s.strip()), f"HTTP {status}")
    return code, line[:MESSAGE_LIMIT] + ("..." if len(line) > MESSAGE_LIMIT else "")


async def answer(send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error_code": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
