"""Where runs are recorded, and whether this process records at all: the tracking URI,
where a local store keeps its artifacts, the chief-only rule, the reachability check
that fails a stage in seconds, `redact` (no credentials in what is written or logged)
and `use_uri`, the one place that points MLflow at a store. MLflow is imported lazily.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tfmlops.config import Config
from tfmlops.errors import TrackingUnavailable
from tfmlops.project import SQLITE, exported_by_mlflow, repo_root, store_uri  # noqa: F401 - repo_root: re-exported

# `scheme://user:password@` up to the last "@" of the line (a raw "@", "/", quote or
# space in a password must not leave its tail behind: removing too much of a message
# is safe, leaving part of a password is not), not across another URI's "://".
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)(?:(?!://)[^\r\n])*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&;](?:password|passwd|pwd|secret|token|access_token|api_key|sslpassword)=)"
    r"[^&;\s'\"]*?(?=[&;\s'\"]|:\s|:?$)")  # a message's "uri: reason" keeps its colon


def redact(text: str) -> str:
    """`text` with the credentials of every URI in it removed: the tracking URI goes into
    `mlflow_run.json` (pushed to the DVC remote), logs and error messages."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1", str(text)))


def tracking_uri(cfg: Config) -> str:
    """MLFLOW_TRACKING_URI (a shared server) wins over params' tracking.uri."""
    return store_uri(cfg.tracking.uri)


def artifact_location(uri: str) -> str | None:
    """Artifacts of a local store sit beside its database file (never in a temp copy)."""
    if uri.startswith(SQLITE):
        return (Path(uri[len(SQLITE):]).parent / "mlartifacts").as_uri()
    return None  # a server decides (`mlflow server --artifacts-destination`)


def ui_url(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's page of an experiment (or of one of its runs), in the training
    view: the tracking server's own UI, or the README's `mlflow ui` for a local store."""
    base = redact(uri).rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    page = f"{base}/#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    # MLflow's UI keeps a GenAI / Model-training switch in the browser (default GenAI):
    # a link names the view, or a fresh browser opens an experiment on the GenAI overview.
    return f"{page}?workflowType=machine_learning"


def is_chief() -> bool:
    """Under TF_CONFIG only the chief (or worker 0 when there is no chief) records."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return True
    tf_config = json.loads(raw)
    task = tf_config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if "chief" in tf_config.get("cluster", {}):
        return kind == "chief"
    return kind == "worker" and index == 0


def ensure_reachable(uri: str, timeout_s: float) -> None:
    """Fail within seconds, before any expensive work, if the store is away."""
    if uri.startswith(("http://", "https://")):
        import urllib.error  # here: urllib.request's import is slow, a SQLite store needs none
        import urllib.request

        try:
            with urllib.request.urlopen(_health_request(uri), timeout=timeout_s) as resp:
                if resp.status >= 500:
                    raise OSError(f"HTTP {resp.status}")
        except (OSError, ValueError, urllib.error.URLError) as exc:  # ValueError: a bad URL
            reason = getattr(exc, "reason", exc)
            if isinstance(exc, urllib.error.HTTPError):  # it answered: say what
                reason = f"HTTP {exc.code} {exc.reason}" + (
                    ": check the user and password in the URI" if exc.code in (401, 403) else "")
            raise TrackingUnavailable(
                f"MLflow tracking server {redact(uri)} is unreachable ({redact(reason)}); start it, fix "
                "MLFLOW_TRACKING_URI, or set tracking.enabled: false in params.yaml"
            ) from None
    elif uri.startswith(SQLITE):
        folder = Path(uri[len(SQLITE):]).parent
        if not folder.is_dir():
            raise TrackingUnavailable(
                f"MLflow store {redact(uri)}: folder {folder} does not exist; create it or fix the URI"
            )


def _health_request(uri: str):
    """GET <uri>/health; `user:password@` goes into a Basic auth header, as MLflow's
    client (requests) sends it: urllib reads it as part of the host name."""
    import base64
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    scheme, rest = uri.split("://", 1)
    headers = {}
    if "@" in rest:  # the last "@": a raw "@" or "/" may sit in the password
        userinfo, rest = rest.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    parts = urlsplit(f"{scheme}://{rest}")
    url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/health"))
    return urllib.request.Request(url, headers=headers)


def preflight(cfg: Config) -> None:
    """Fail in seconds if the store is away: for a stage to call before its expensive work."""
    if cfg.tracking.enabled and is_chief():
        ensure_reachable(tracking_uri(cfg), cfg.tracking.connect_timeout_s)


def use_uri(uri: str):
    """Point MLflow at `uri` (the only place that does) and return the module."""
    mlflow = import_mlflow()
    exported = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if exported != uri:  # a value the user exported stays the user's choice
        exported_by_mlflow(uri)
    db = Path(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None
    if db is not None and db.parent.is_dir():
        from filelock import FileLock

        # The first process to touch a fresh SQLite store creates it by running the
        # schema migrations; processes racing on that crash ("Online migration
        # expected to match one row"). One at a time; the store is then cached.
        with FileLock(f"{db}-lock"):
            mlflow.MlflowClient()
    return mlflow


def attempt_bound_s() -> float:
    """The longest one store call can take under those bounds: each of MLflow's HTTP
    tries at its timeout, plus its backoff (urllib3: factor * 2**n). A SQLite store
    answers or says "database is locked" well within it (sqlite3 waits 5 s)."""
    def bound(name: str) -> float:
        try:
            return float(os.environ.get(name, _HTTP_BOUNDS[name]))
        except ValueError:
            return float(_HTTP_BOUNDS[name])

    tries = int(bound("MLFLOW_HTTP_REQUEST_MAX_RETRIES")) + 1
    return (tries * bound("MLFLOW_HTTP_REQUEST_TIMEOUT")
            + bound("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR") * 2 ** (tries - 1))


# MLflow's own HTTP retries, bounded so our retry loop decides (retry.py); a user's
# explicit setting still wins.
_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def import_mlflow():
    """The mlflow module, with its own HTTP retries bounded (see retry.py) and its run
    links kept off stdout."""
    for name, value in _HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)
    # Against an HTTP store MLflow writes "View run ... at: <URI>/#/..." to stdout as each
    # run ends, with the URI as given: `http://user:password@host` keeps its password, and
    # the line breaks "stdout carries only the JSON result" (`tfmlops promote | jq`). The
    # stages log their own, redacted links (ui_url). Read when a run ends: set it first.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    import mlflow

    return mlflow


def client():
    """An MlflowClient of the store `use_uri` chose."""
    return import_mlflow().MlflowClient()
