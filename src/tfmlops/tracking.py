"""Every MLflow call of the project goes through this module.

A stage says what to record; this module knows the tracking URI (the repo's
SQLite store unless MLFLOW_TRACKING_URI names a shared server), run naming,
tags, lineage (each stage writes `mlflow_run.json` next to its outputs so the
chain survives DVC's cache), chief-only logging under multi-worker training,
and what to do when the server goes away: retry with a bounded backoff, then
queue the call in an outbox that `tfmlops sync` replays. A logging failure
never destroys a stage's outputs.

MLflow is imported lazily: `tfmlops --help` must not pay for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfmlops.config import Config, flatten
from tfmlops.errors import TrackingUnavailable

log = logging.getLogger(__name__)

RUN_FILE = "mlflow_run.json"
OUTBOX_DIR = "outbox"
# Calls `tfmlops sync` can replay from a JSON line (figures and models are queued
# as artifact files instead; arbitrary `run.call(fn)` callables cannot be).
REPLAYABLE = {"params", "metrics", "tags", "artifact", "dict", "dataset", "end"}
# Error codes of a store that answered and refused: a replay would be refused too,
# so these are reported and dropped instead of sending the stage offline.
_REFUSED = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS",
            "INVALID_STATE"}
_EXPS_TMP = os.sep + os.path.join(".dvc", "tmp", "exps") + os.sep


# ----------------------------------------------------------------- where

def repo_root(start: str | Path | None = None) -> Path:
    """The project root, also from inside a `dvc exp run --temp/--queue` copy.

    DVC runs temporary and queued experiments in `<repo>/.dvc/tmp/exps/<tmp>/`;
    their runs must land in the real repo's store, not in the throwaway copy.
    """
    here = Path(start or os.environ.get("DVC_ROOT") or os.getcwd()).resolve()
    text = str(here) + os.sep
    if _EXPS_TMP in text:
        return Path(text.split(_EXPS_TMP, 1)[0])
    for p in (here, *here.parents):
        if (p / "dvc.yaml").exists() or (p / ".dvc").is_dir():
            return p
    return here


_uri_set_here: str | None = None


def tracking_uri(cfg: Config) -> str:
    """MLFLOW_TRACKING_URI (a shared server) wins over params' tracking.uri."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    # mlflow.set_tracking_uri exports the variable itself: ignore our own echo.
    uri = env if env and env != _uri_set_here else cfg.tracking.uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(repo_root() / uri[len("sqlite:///"):])
    elif "://" not in uri:  # a plain folder (file store)
        uri = str(repo_root() / uri)
    return uri


def artifact_location(uri: str) -> str | None:
    """Artifacts of a local store sit beside its database file (never in a temp copy)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return None  # a server decides (`mlflow server --artifacts-destination`)


def is_chief() -> bool:
    """Under TF_CONFIG only the chief (or worker 0 when there is no chief) records."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return True
    tf_config = json.loads(raw)
    task = tf_config.get("task", {})
    cluster = tf_config.get("cluster", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if "chief" in cluster:
        return kind == "chief"
    return kind == "worker" and index == 0


def ensure_reachable(uri: str, timeout_s: float) -> None:
    """Fail within seconds, before any expensive work, if the store is away."""
    if uri.startswith(("http://", "https://")):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                if resp.status >= 500:
                    raise OSError(f"HTTP {resp.status}")
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingUnavailable(
                f"MLflow tracking server {uri} is unreachable ({reason}); start it, fix "
                "MLFLOW_TRACKING_URI, or set tracking.enabled: false in params.yaml"
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise TrackingUnavailable(
                f"MLflow store {uri}: folder {folder} does not exist; create it or fix the URI"
            )


def preflight(cfg: Config) -> None:
    """Fail now, in seconds, if the store this stage will record to is away.

    For a stage to call first, before it reads or validates data or imports
    TensorFlow; `stage_run` checks again when it opens the run.
    """
    if cfg.tracking.enabled and is_chief():
        ensure_reachable(tracking_uri(cfg), cfg.tracking.connect_timeout_s)


def use_uri(uri: str):
    """Point MLflow at `uri` (the only place that does) and return the module."""
    global _uri_set_here
    mlflow = _import_mlflow()
    mlflow.set_tracking_uri(uri)
    _uri_set_here = uri
    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is not None and db.parent.is_dir():
        # The first process to touch a fresh SQLite store creates it by running the
        # schema migrations; processes racing on that crash ("Online migration
        # expected to match one row"). One at a time; the store is then cached.
        with _file_lock(Path(f"{db}-lock")):
            mlflow.MlflowClient()
    return mlflow


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (the race stays possible there)
        yield
        return
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _import_mlflow():
    # Bound MLflow's own HTTP retries (default: 7 retries, minutes of backoff) so
    # our retry/outbox logic decides; a user's explicit setting still wins.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    import mlflow

    return mlflow


# ---------------------------------------------------------------- lineage

def git_state(root: Path) -> tuple[str, bool]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root, capture_output=True, text=True, timeout=10,
            ).stdout.strip()
        )
        return commit or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def read_run_file(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def data_version(cfg: Config) -> str:
    manifest = Path(cfg.paths.prepared) / "manifest.json"
    if not manifest.is_file():
        return "none"
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


# ------------------------------------------------------------------ runs

class StageRun:
    """One MLflow run. Every method is safe: failures are retried, then queued."""

    def __init__(self, cfg: Config, stage: str, run_id: str | None, outbox: Path | None):
        self.cfg = cfg
        self.stage = stage
        self.run_id = run_id
        self._outbox = outbox
        self._offline = False
        self.errors: list[str] = []
        self.queued = 0  # calls written to the outbox

    @property
    def active(self) -> bool:
        return self.run_id is not None

    # -- what stages call
    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: _param_value(v) for k, v in flatten(params).items()}
        items = sorted(flat.items())
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self._do("params", dict(items[i : i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in flatten(metrics).items() if _is_number(v)}
        if clean:
            # The time of the measurement, also when the outbox replays it later.
            self._do("metrics", {"metrics": clean, "step": step, "timestamp": _now_ms()})

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._do("tags", {k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self._do("artifact", {"path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def log_dict(self, data: Any, name: str) -> None:
        self._do("dict", {"data": data, "name": name})

    def log_figure(self, figure, name: str) -> None:
        sent = self._call(lambda c: c.log_figure(self.run_id, figure, name), "figure", {"name": name})
        if self.active and not sent and self._outbox is not None:
            file = self._outbox_files() / Path(name).name
            figure.savefig(file)
            self._write_outbox("artifact", {"path": str(file), "artifact_path": _parent(name)})

    def log_dataset(self, name: str, source: str, digest: str, context: str) -> None:
        self._do("dataset", {"name": name, "source": source, "digest": digest, "context": context})

    def log_keras_model(self, model, saved_path: str | Path, **kwargs) -> None:
        """Log (and optionally register) a Keras model; on failure queue its saved file."""

        # Declared, not inferred: MLflow's inference reloads the model in a fresh
        # Python (~15 s of TensorFlow import) on every log.
        kwargs.setdefault("pip_requirements", pinned_requirements(
            "mlflow", "tensorflow", "keras", "numpy"))

        def go(_client):
            mlflow = _import_mlflow()
            with _resumed(mlflow, self.run_id):
                mlflow.tensorflow.log_model(model, name="model", **kwargs)

        ok = self._call(go, "model", {"path": str(Path(saved_path).resolve())})
        if self.active and not ok:
            self._queue("artifact", {"path": str(Path(saved_path).resolve()), "artifact_path": "model_file"})

    def call(self, fn, what: str) -> bool:
        """Run `fn(mlflow)` inside this run (for flavour-specific logging)."""
        mlflow = _import_mlflow()

        def go(_client):
            with _resumed(mlflow, self.run_id):
                fn(mlflow)

        return self._call(go, what, {})

    @contextlib.contextmanager
    def child(self, name: str, tags: dict[str, Any] | None = None) -> Iterator[StageRun]:
        """A nested run (`mlflow.parentRunId`), e.g. one keras-tuner trial."""
        child = self.start_child(name, tags)
        status = "FINISHED"
        try:
            yield child
        except BaseException:
            status = "FAILED"
            raise
        finally:
            child.end(status)

    def start_child(self, name: str, tags: dict[str, Any] | None = None) -> StageRun:
        """A nested run the caller ends with `end(status)`.

        For code driven by hooks rather than a `with` block, such as keras-tuner's
        on_trial_begin/on_trial_end, where a failed trial is not an exception.
        """
        child = StageRun(self.cfg, self.stage, None, self._outbox)
        if self.active and not self._offline:
            try:
                client = _client()
                run = client.create_run(
                    self._experiment_id(),
                    run_name=name,
                    tags={"mlflow.parentRunId": self.run_id, "tfmlops.stage": self.stage,
                          **{k: str(v) for k, v in (tags or {}).items()}},
                )
                child.run_id = run.info.run_id
            except Exception as exc:  # noqa: BLE001 - tracking must never kill the work
                self._note(f"child run {name}: {exc}")
        return child

    def end(self, status: str = "FINISHED") -> None:
        if self.active:
            self._do("end", {"status": status})

    # -- machinery
    def _experiment_id(self) -> str:
        return _client().get_run(self.run_id).info.experiment_id

    def _do(self, op: str, payload: dict[str, Any]) -> None:
        self._call(lambda c: _apply(c, self.run_id, op, payload), op, payload)

    def _call(self, fn, op: str, payload: dict[str, Any]) -> bool:
        """Send one call: retried with a bounded backoff, then queued in the outbox.

        After one call has exhausted its retries the stage is offline: every later
        call goes straight to the outbox, so an outage costs its retries once.
        """
        if not self.active:
            return False
        if self._offline:
            self._queue(op, payload)
            return False
        attempts = self.cfg.tracking.retries + 1
        for attempt in range(attempts):
            try:
                fn(_client())
                return True
            except Exception as exc:  # noqa: BLE001 - tracking must never kill the work
                last = exc
                if getattr(exc, "error_code", None) in _REFUSED:
                    self._note(f"{op} refused by the store, not queued: {_first_line(exc)}")
                    return False
                if attempt + 1 < attempts:
                    time.sleep(_backoff_s(attempt))
        self._offline = True
        self._note(f"{op} failed after {attempts} attempts ({_first_line(last)}); this and later "
                   "calls go to the outbox for `tfmlops sync`")
        self._queue(op, payload)
        return False

    def _queue(self, op: str, payload: dict[str, Any]) -> None:
        if self._outbox is None or op in ("figure", "model"):
            return  # their callers queue a file instead
        if op not in REPLAYABLE:
            self.errors.append(f"{op}: not sent and not replayable (the server was away)")
            return
        if op == "artifact":
            source = Path(payload["path"])
            if not source.exists():
                self.errors.append(f"artifact {source}: gone before it could be queued")
                return
            # A copy the outbox owns: stages move their staging folders after logging.
            kept = self._outbox_files() / source.name
            if source.is_dir():
                shutil.copytree(source, kept)
            else:
                shutil.copy2(source, kept)
            payload = {**payload, "path": str(kept)}
        self._write_outbox(op, payload)

    def _outbox_files(self) -> Path:
        """A fresh folder for the files of the next outbox entry."""
        folder = self._outbox.with_suffix(".files") / str(self.queued)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def _write_outbox(self, op: str, payload: dict[str, Any]) -> None:
        self._outbox.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": self.run_id, "op": op, "payload": payload}, default=str)
        with self._outbox.open("a") as fh:
            fh.write(line + "\n")
        self.queued += 1

    def _note(self, msg: str) -> None:
        self.errors.append(msg)
        print(f"tfmlops: MLflow logging problem ({self.stage}): {msg}", file=sys.stderr)


class _NullRun(StageRun):
    """Tracking off (params) or not the chief: the same interface, no calls."""

    def __init__(self, cfg: Config, stage: str):
        super().__init__(cfg, stage, None, None)


@contextlib.contextmanager
def _resumed(mlflow, run_id: str):
    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        yield
        return
    with mlflow.start_run(run_id=run_id):
        yield


def pinned_requirements(*names: str) -> list[str]:
    """`name==installed version` for each installed distribution (a model's pip deps)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name}=={version(name)}")
    return out


def _client():
    mlflow = _import_mlflow()
    return mlflow.MlflowClient()


def _backoff_s(attempt: int) -> float:
    """0.5, 1, 2, 4, 8, 8, ... seconds: bounded, so an outage costs a known time."""
    return min(0.5 * 2**attempt, 8.0)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _parent(name: str) -> str | None:
    parent = str(Path(name).parent)
    return None if parent == "." else parent


def _log_dataset(client, run_id: str, name: str, source: str, digest: str, context: str) -> None:
    warnings.filterwarnings("ignore", message="The specified dataset source")
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    ds = MetaDataset(resolve_dataset_source(source), name=name, digest=digest)
    tag = InputTag(key="mlflow.data.context", value=context)
    client.log_inputs(run_id, [DatasetInput(ds._to_mlflow_entity(), [tag])])


def _apply(client, run_id: str, op: str, payload: dict[str, Any]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    if op == "params":
        client.log_batch(run_id, params=[Param(k, v) for k, v in payload.items()])
    elif op == "metrics":
        stamp = payload.get("timestamp") or _now_ms()
        step = payload.get("step") or 0
        metrics = [Metric(k, v, stamp, step) for k, v in payload["metrics"].items()]
        client.log_batch(run_id, metrics=metrics)
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in payload.items()])
    elif op == "artifact":
        path = Path(payload["path"])
        if path.is_dir():
            client.log_artifacts(run_id, str(path), payload.get("artifact_path") or path.name)
        elif path.exists():
            client.log_artifact(run_id, str(path), payload.get("artifact_path"))
    elif op == "dict":
        client.log_dict(run_id, payload["data"], payload["name"])
    elif op == "dataset":
        _log_dataset(client, run_id, **payload)
    elif op == "end":
        client.set_terminated(run_id, payload["status"])
    else:
        raise ValueError(f"unknown outbox op {op}")


def _param_value(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return text[:6000]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


# ---------------------------------------------------------------- entry

@contextlib.contextmanager
def stage_run(
    cfg: Config,
    stage: str,
    out_dir: str | Path,
    upstream: dict[str, str | Path] | None = None,
    params: dict[str, Any] | None = None,
) -> Iterator[StageRun]:
    """Open the stage's run, tag it, log its params, write `mlflow_run.json`.

    `upstream` maps stage names to the output folders this stage reads; their
    run ids become `tfmlops.upstream.<stage>` tags (lineage). `params` is the
    part of the resolved config this stage uses (default: all of it).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.tracking.enabled or not is_chief():
        run = _NullRun(cfg, stage)
        _write_run_file(out_dir, stage, None, None)
        yield run
        return

    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    mlflow = use_uri(uri)
    try:
        experiment_id = _experiment_id(mlflow, cfg.tracking.experiment, uri)
        root = repo_root()
        commit, dirty = git_state(root)
        tags = {
            "tfmlops.stage": stage,
            "tfmlops.params_hash": cfg.digest(),
            "tfmlops.data_version": data_version(cfg),
            "mlflow.source.git.commit": commit,
            "tfmlops.git_dirty": str(dirty).lower(),
        }
        if os.environ.get("DVC_EXP_NAME"):
            tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
        for name, folder in (upstream or {}).items():
            up = read_run_file(folder)
            if up.get("run_id"):
                tags[f"tfmlops.upstream.{name}"] = up["run_id"]
        # `mlflow run` (MLproject) hands its own run down in MLFLOW_RUN_ID, which
        # start_run would resume: every stage of `-e main` would share one run.
        # Each stage opens its own run instead, nested under the launcher's.
        launcher = os.environ.pop("MLFLOW_RUN_ID", None)
        if launcher:
            tags["mlflow.parentRunId"] = launcher
        active = mlflow.start_run(experiment_id=experiment_id, run_name=stage, tags=tags)
    except TrackingUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the server died between check and start
        raise TrackingUnavailable(
            f"MLflow tracking at {uri} failed to open a run ({str(exc).splitlines()[0][:160]}); "
            "check the server or set tracking.enabled: false"
        ) from None

    run_id = active.info.run_id
    outbox = Path(cfg.paths.reports) / OUTBOX_DIR / f"{stage}-{run_id}.jsonl"
    run = StageRun(cfg, stage, run_id, outbox)
    _write_run_file(out_dir, stage, run_id, uri)
    run.log_params(params if params is not None else cfg.to_dict())
    status = "FINISHED"
    try:
        yield run
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        run.end(status)
        with contextlib.suppress(Exception):
            mlflow.end_run(status)
        if run.queued:
            print(f"tfmlops: {stage}: {run.queued} MLflow calls wait in {outbox}; run `tfmlops sync` "
                  f"once {uri} is back", file=sys.stderr)


def _experiment_id(mlflow, name: str, uri: str) -> str:
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location(uri))
        except Exception:  # noqa: BLE001 - another process created it first
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


def attach_run(cfg: Config, stage: str, tags: dict[str, str], wait_s: float = 0.0) -> StageRun:
    """The open run of `stage` carrying `tags`, started by another process.

    For the workers of a distributed search: the chief opens the stage's run
    and each worker nests its trials under it, so they appear once, under one
    parent. The caller records into the run but never ends it. Tracking off,
    or no such run within `wait_s` seconds: a run that records nothing.
    """
    if not cfg.tracking.enabled:
        return _NullRun(cfg, stage)
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    client = use_uri(uri).MlflowClient()
    query = " and ".join([f"tags.`tfmlops.stage` = '{stage}'", "attributes.status = 'RUNNING'",
                          *(f"tags.`{k}` = '{v}'" for k, v in tags.items())])
    give_up = time.monotonic() + wait_s
    while True:
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        runs = [] if exp is None else client.search_runs(
            [exp.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            run_id = runs[0].info.run_id
            outbox = Path(cfg.paths.reports) / OUTBOX_DIR / f"{stage}-{run_id}-{os.getpid()}.jsonl"
            return StageRun(cfg, stage, run_id, outbox)
        if time.monotonic() >= give_up:
            print(f"tfmlops: no open MLflow run of {stage} with {tags} after {wait_s:.0f} s; "
                  "this process records nothing", file=sys.stderr)
            return _NullRun(cfg, stage)
        time.sleep(min(2.0, max(give_up - time.monotonic(), 0.1)))


def _write_run_file(out_dir: Path, stage: str, run_id: str | None, uri: str | None) -> None:
    data = {"stage": stage, "run_id": run_id, "tracking_uri": uri}
    tmp = out_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(out_dir / RUN_FILE)


# ----------------------------------------------------------------- sync

def sync(cfg: Config) -> dict[str, int]:
    """Replay every queued call in `reports/outbox/` against the current store, in order.

    A file is deleted (with its copied artifacts) once all its calls went through.
    If the store fails midway, the calls not yet sent are kept and the command
    stops with one line: running it again resumes there.
    """
    folder = Path(cfg.paths.reports) / OUTBOX_DIR
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        return {"files": 0, "calls": 0}
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    client = use_uri(uri).MlflowClient()
    sent = 0
    for path in files:
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for i, entry in enumerate(entries):
            try:
                _apply(client, entry["run_id"], entry["op"], entry["payload"])
            except Exception as exc:  # noqa: BLE001 - keep what is left, say where it stopped
                rest = "".join(json.dumps(e) + "\n" for e in entries[i:])
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(rest)
                tmp.replace(path)
                raise TrackingUnavailable(
                    f"sync stopped at {path.name} call {i + 1} ({entry['op']} of run "
                    f"{entry['run_id']}) on {uri}: {_first_line(exc)}; {sent} calls sent, "
                    f"{len(entries) - i} kept; fix the store and run `tfmlops sync` again"
                ) from None
            sent += 1
        path.unlink()
        shutil.rmtree(path.with_suffix(".files"), ignore_errors=True)
    return {"files": len(files), "calls": sent}
