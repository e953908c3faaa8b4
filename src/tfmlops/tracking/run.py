"""A stage's MLflow run: open it, record into it safely, close it.

Owns `StageRun` (every call retried, then queued in the outbox; without a run id it
records nothing), `stage_run` (the context manager every stage opens: tags, params,
lineage file, heartbeat), `attach_run` (a tuner worker records into the run its chief
opened) and `stage_runs` (what `tfmlops history` reads). Most stages keep their run in
a separate process (sidecar.py), which replays their calls into one of these.

Metrics, params and tags are sent synchronously: MLflow's async queue made every
stage's end wait about 1 s (its logging thread polls its queue each second before it
can stop), more than a stage's few synchronous batches cost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfmlops.artifacts import TAG_STAGE
from tfmlops.config import Config, flatten
from tfmlops.errors import TrackingUnavailable
from tfmlops.tracking import keras_file
from tfmlops.tracking.heartbeat import HEARTBEAT_TAG, Heartbeat
from tfmlops.tracking.lineage import run_tags, write_run_file
from tfmlops.tracking.naming import equals, experiment_id_of, stage_run_name
from tfmlops.tracking.ops import PENDING, REFUSED, apply, now_ms
from tfmlops.tracking.outbox import OUTBOX_DIR, Outbox, deliver_handed_over, outbox_path
from tfmlops.tracking.retry import RetriesExhausted, call_with_retry, first_line
from tfmlops.tracking.stale import all_runs, close_orphans, owner_tags
from tfmlops.tracking.uri import (
    client,
    ensure_reachable,
    import_mlflow,
    is_chief,
    redact,
    tracking_uri,
    ui_url,
    use_uri,
)

log = logging.getLogger(__name__)


class StageRun:
    """One MLflow run. Every method is safe: failures are retried, then queued."""

    def __init__(self, cfg: Config, stage: str, run_id: str | None, outbox: Outbox | None):
        self.cfg, self.stage, self.run_id, self._outbox = cfg, stage, run_id, outbox
        self._offline = False
        self.errors: list[str] = []
        self.queued = 0  # calls of this run written to the outbox
        self._jobs: list[ModelLogging] = []  # models being logged in a thread
        self.ended: str | None = None  # the status end() gave, once it has run
        self.heartbeat: Heartbeat | None = None  # renews the run's heartbeat while it is open

    @property
    def active(self) -> bool:
        return self.run_id is not None

    # -- what stages call
    def log_params(self, params: dict[str, Any]) -> None:
        for batch in param_batches(params):
            self._do("params", batch)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in flatten(metrics).items() if _is_number(v)}
        if not clean:
            return
        # The time of the measurement, also when the outbox replays it later.
        self._do("metrics", {"metrics": clean, "step": step, "timestamp": now_ms()})

    def wait_open(self) -> None:
        """Return once the run is open and its `mlflow_run.json` written (already so here)."""

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._do("tags", {k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self._do("artifact", {"path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def log_drawn(self, draw, args: tuple, artifact_path: str | None = None) -> None:
        """Log what `draw(*args, folder)` writes into a scratch `folder` and returns (a
        file or a folder): figures only the run shows, drawn only if it records (by the
        sidecar, out of the stage's time, when one keeps it)."""
        if self.active:
            with tempfile.TemporaryDirectory(prefix="tfmlops-drawn-") as folder:
                self.log_artifact(draw(*args, Path(folder)), artifact_path)

    def log_dict(self, data: Any, name: str) -> None:
        self._do("dict", {"data": data, "name": name})

    def log_dataset(self, name: str, source: str, digest: str, context: str) -> None:
        self._do("dataset", {"name": name, "source": source, "digest": digest, "context": context})

    def start_keras_model(self, model, saved_path: str | Path | None = None,
                          **kwargs) -> ModelLogging:
        """Nothing to log in a run that records nothing. A Keras model is logged by a run
        the sidecar keeps (`SidecarRun.start_keras_model`): never TensorFlow and MLflow in
        one process."""
        if self.active:
            raise TypeError("a Keras model is logged by the tracking sidecar's run "
                            "(tracking.sidecar_run), not by a run in the stage's process")
        return ModelLogging(self, None)

    def start_saved_keras_model(self, described: dict[str, Any]) -> ModelLogging:
        """Start logging a model from its saved file (`keras_file.describe`) in a thread
        (the sidecar's way); the caller calls `wait(saved_path)` (the run's end waits too)."""
        if not self.active:
            return ModelLogging(self, None)
        # Declared, not inferred: MLflow's inference reloads the model in a fresh
        # Python (~15 s of TensorFlow import) on every log.
        requirements = pinned_requirements("mlflow", "tensorflow", "keras", "numpy")
        bad: list[BaseException] = []  # not a store problem: raised by wait(), not queued

        def go(_client):
            try:
                keras_file.log_saved(self.run_id, described, requirements)
            except Exception as exc:
                from mlflow.exceptions import MlflowException

                # The store's problem: retried, then the caller queues the saved file.
                if isinstance(exc, (MlflowException, OSError)):
                    raise
                bad.append(exc)  # a bug or a model that cannot be saved

        def job() -> bool:
            sent = self._call(go, "model", {})
            if bad:
                raise bad[0]
            return sent

        logging_job = ModelLogging(self, Background(job, "log-model"))
        self._jobs.append(logging_job)
        return logging_job

    def call(self, fn, what: str) -> bool:
        """Run `fn(mlflow)` inside this run (for flavour-specific logging)."""
        mlflow = import_mlflow()

        def go(_client):
            active = mlflow.active_run()
            resume = active is None or active.info.run_id != self.run_id  # not the fluent run yet
            with mlflow.start_run(run_id=self.run_id) if resume else contextlib.nullcontext():
                fn(mlflow)

        return self._call(go, what, {})

    def perform(self, fn, *args):
        """`fn(run, *args)` where the run is kept: here, or in the tracking sidecar (`fn`
        importable there, `args` and the result picklable), so a stage's registry work
        adds no MLflow client to its own process."""
        return fn(self, *args)

    def start_child(self, name: str, tags: dict[str, Any] | None = None) -> StageRun:
        """A nested run the caller ends with `end(status)`: for code driven by hooks, such
        as keras-tuner's on_trial_begin/on_trial_end, where a failed trial is not an
        exception."""
        # The parent's outbox: one queue file, whose entries each name their run.
        child = StageRun(self.cfg, self.stage, None, self._outbox)
        if not self.active:
            return child
        tags = {TAG_STAGE: self.stage, **owner_tags(), **{k: str(v) for k, v in (tags or {}).items()}}
        if not self._offline:
            try:
                mlflow_client = client()
                experiment_id = mlflow_client.get_run(self.run_id).info.experiment_id
                child.run_id = mlflow_client.create_run(
                    experiment_id, run_name=name, tags={"mlflow.parentRunId": self.run_id, **tags},
                ).info.run_id
            except Exception as exc:  # noqa: BLE001 - tracking must never kill the work
                self._note(f"child run {name}: {first_line(exc)}; queued for `tfmlops sync`")
        if child.run_id is None and self._outbox is not None:
            # The store is away: the child gets a local id, and its creation and every call
            # go to the outbox, where `sync` creates it under this run and sends them.
            child.run_id = f"{PENDING}{uuid.uuid4().hex}"
            child._offline = True
            self._outbox.write(child.run_id, "create_run", {
                "parent": self.run_id, "name": name, "start_time": now_ms(), "tags": tags})
            child.queued += 1
        return child

    def end(self, status: str = "FINISHED") -> None:
        """Finish what runs in the background, then end the run with `status` (once)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.active and self.ended is None:
            self.ended = status
            for job in list(self._jobs):  # a stage that failed before it waited for its model
                try:
                    job.wait(None)
                except Exception as exc:  # noqa: BLE001 - the stage's own error is raised
                    self._note(f"model logging failed: {first_line(exc)}")
            self._do("end", {"status": status})

    # -- machinery
    def _do(self, op: str, payload: dict[str, Any]) -> None:
        self._call(lambda c: apply(c, self.run_id, op, payload), op, payload)

    def _call(self, fn, op: str, payload: dict[str, Any]) -> bool:
        """Send one call: retried, then queued in the outbox. After one call has exhausted
        its retries the run is offline: later calls go straight to the outbox, so an
        outage costs its retries once."""
        if not self.active:
            return False
        if self._offline:
            self._queue(op, payload)
            return False
        try:
            call_with_retry(lambda: fn(client()), self.cfg.tracking.retries + 1, final_codes=REFUSED)
            return True
        except RetriesExhausted as exc:
            self._offline = True
            self._note(f"{op} failed after {exc.attempts} attempts ({first_line(exc.last)}); this "
                       "and later calls go to the outbox for `tfmlops sync`")
            self._queue(op, payload)
            return False
        except Exception as exc:  # noqa: BLE001 - only a refusal (REFUSED) gets here
            self._note(f"{op} refused by the store, not queued: {first_line(exc)}")
            return False

    def _queue(self, op: str, payload: dict[str, Any]) -> None:
        if self._outbox is None or op == "model":
            return  # its caller queues the saved file instead
        if problem := self._outbox.queue(self.run_id, op, payload):
            self.errors.append(problem)
        else:
            self.queued += 1

    def _note(self, msg: str) -> None:
        self.errors.append(msg)
        log.warning("tfmlops: MLflow logging problem (%s): %s", self.stage, msg)


class ModelLogging:
    """A model being logged in a thread (`StageRun.start_saved_keras_model`)."""

    def __init__(self, run: StageRun, job: Background | None):
        self._run, self._job = run, job

    def wait(self, saved_path: str | Path | None) -> bool:
        """Wait; raise what went wrong that is not the store (a model that cannot be
        saved, a bug). The store away: queue `saved_path` for `tfmlops sync`."""
        if self._job is None:
            return False
        job, self._job = self._job, None
        self._run._jobs.remove(self)
        sent = job.join()
        if not sent and saved_path is not None and self._run.active:
            self._run._queue("artifact", {"path": str(Path(saved_path).resolve()),
                                          "artifact_path": "model_file"})
        return sent


class Background:
    """`fn()` in a daemon thread; `join()` waits and raises whatever `fn` raised, so a
    failure there fails the stage instead of vanishing with the thread."""

    def __init__(self, fn: Callable[[], Any], name: str):
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name=f"tfmlops-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def join(self) -> Any:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def pinned_requirements(*names: str) -> list[str]:
    """`name==installed version` for each installed distribution (a model's pip deps)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name}=={version(name)}")
    return out


def param_batches(params: dict[str, Any]) -> list[dict[str, str]]:
    """`params` flattened to MLflow's params, in batches of at most 100 (its limit)."""
    items = sorted((k, _param_value(v)) for k, v in flatten(params).items())
    return [dict(items[i : i + 100]) for i in range(0, len(items), 100)]


def opening_tags(cfg: Config, stage: str, upstream: dict[str, str | Path] | None) -> dict[str, str]:
    """The tags a stage's run opens with (lineage.run_tags, a heartbeat not yet beaten)."""
    tags = {**run_tags(cfg, stage, upstream), HEARTBEAT_TAG: "0"}
    # `mlflow run` (MLproject) hands its own run down in MLFLOW_RUN_ID, which
    # start_run would resume: every stage of `-e main` would share one run.
    # Each stage opens its own run instead, nested under the launcher's.
    if launcher := os.environ.pop("MLFLOW_RUN_ID", None):
        tags["mlflow.parentRunId"] = launcher
    return tags


def _param_value(v: Any) -> str:
    return (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:6000]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


# ---------------------------------------------------------------- entry

@contextlib.contextmanager
def stage_run(cfg: Config, stage: str, out_dir: str | Path,
              upstream: dict[str, str | Path] | None = None, params: dict[str, Any] | None = None,
              *, facts: dict[str, Any] | None = None) -> Iterator[StageRun]:
    """Open the stage's run, tag it, log its params, write `mlflow_run.json`.

    `upstream` maps stage names to the output folders this stage reads; their run ids
    become `tfmlops.upstream.<stage>` tags (lineage). `params` is the part of the
    resolved config this stage uses (default: all of it). `facts` go into
    `mlflow_run.json` too (prepare's data version: lineage.linked_run_id checks it).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.tracking.enabled or not is_chief():
        write_run_file(out_dir, stage, None, None, facts)
        yield StageRun(cfg, stage, None, None)  # tracking off or not the chief: no calls
        return

    uri = tracking_uri(cfg)
    params = params if params is not None else cfg.to_dict()
    # Runs handed over and left undelivered by a kill go first: this run's lineage names them.
    deliver_handed_over(cfg)
    run_id = _open_run(cfg, stage, uri, upstream, stage_run_name(stage, params))
    # Runs of this stage a SIGKILL left RUNNING. This machine's sightings of other machines'
    # heartbeats are kept beside the outbox (local state, never in git).
    sightings = Path(cfg.paths.reports) / OUTBOX_DIR / "heartbeats_seen.json"
    close_orphans(stage, run_id, sightings, cfg.tracking.retries + 1)
    write_run_file(out_dir, stage, run_id, uri, facts)
    run = StageRun(cfg, stage, run_id, Outbox(outbox_path(cfg, f"{stage}-{run_id}"), uri))
    run.heartbeat = Heartbeat(run.run_id, cfg.tracking.retries + 1).start()
    try:
        run.log_params(params)
        with ending(run):
            yield run
    finally:
        run.heartbeat.stop()
        with contextlib.suppress(Exception):
            import_mlflow().end_run(run.ended)
        warn_queued(run, uri)


def warn_queued(run: StageRun, uri: str) -> None:
    """Say where the calls the store missed wait, if any."""
    if run.queued:
        log.warning("tfmlops: %s: %d MLflow calls wait in %s; run `tfmlops sync` once %s is back",
                    run.stage, run.queued, run._outbox.path, redact(uri))


@contextlib.contextmanager
def ending(run: StageRun) -> Iterator[None]:
    """End `run` as the block ends: FINISHED, KILLED (KeyboardInterrupt, SIGTERM) or FAILED."""
    status = "FINISHED"
    try:
        yield
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        run.end(status)


def _open_run(cfg: Config, stage: str, uri: str, upstream: dict[str, str | Path] | None,
              run_name: str) -> str:
    """The id of a new run of `stage`, MLflow's active run; TrackingUnavailable if not."""
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    mlflow = use_uri(uri)
    try:
        experiment_id = experiment_id_of(mlflow, cfg.tracking.experiment, uri)
        tags = opening_tags(cfg, stage, upstream)
        run_id = mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags).info.run_id
        log.info("%s: MLflow run %s: %s (runs table: %s)", stage, run_name,
                 ui_url(uri, experiment_id, run_id), ui_url(uri, experiment_id))
        return run_id
    except TrackingUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the server died between check and start
        raise TrackingUnavailable(
            f"MLflow tracking at {redact(uri)} failed to open a run ({first_line(exc, 160)}); "
            "check the server or set tracking.enabled: false"
        ) from None


def attach_run(cfg: Config, stage: str, tags: dict[str, str], wait_s: float = 0.0) -> StageRun:
    """The open run of `stage` carrying `tags`, started by another process (the chief of
    a distributed search, whose workers nest their trials under it). The caller records
    into it but never ends it. Tracking off, or no such run within `wait_s` seconds: a
    run that records nothing.
    """
    if not cfg.tracking.enabled:
        return StageRun(cfg, stage, None, None)
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    mlflow_client = use_uri(uri).MlflowClient()
    query = " and ".join([equals("tags.`tfmlops.stage`", stage), "attributes.status = 'RUNNING'",
                          *(equals(f"tags.`{k}`", v) for k, v in tags.items())])
    give_up = time.monotonic() + wait_s
    while True:
        exp = mlflow_client.get_experiment_by_name(cfg.tracking.experiment)
        runs = [] if exp is None else mlflow_client.search_runs(
            [exp.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            run_id = runs[0].info.run_id
            # One queue file per worker process: workers never append to the same file.
            outbox = Outbox(outbox_path(cfg, f"{stage}-{run_id}-{os.getpid()}"), uri)
            return StageRun(cfg, stage, run_id, outbox)
        if time.monotonic() >= give_up:
            log.warning("tfmlops: no open MLflow run of %s with %s after %.0f s; "
                        "this process records nothing", stage, tags, wait_s)
            return StageRun(cfg, stage, None, None)
        time.sleep(min(2.0, max(give_up - time.monotonic(), 0.1)))


def stage_runs(cfg: Config, stage: str, params: dict[str, str] | None = None) -> list[dict]:
    """Every run of `stage` (with these `params`), oldest first: id, status, start time, tags.
    Every alias move is a `promote` run whose tags hold its decision (`stages/promote/__init__.py`),
    so the registry's history is a query of those runs; `mlflow.user` says who ran it."""
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    mlflow_client = use_uri(uri).MlflowClient()
    experiment = mlflow_client.get_experiment_by_name(cfg.tracking.experiment)
    if experiment is None:
        return []
    query = " and ".join([equals(f"tags.`{TAG_STAGE}`", stage),
                          *(equals(f"params.`{k}`", v) for k, v in (params or {}).items())])
    return [{"run_id": r.info.run_id, "status": r.info.status, "start_time": r.info.start_time,
             "tags": dict(r.data.tags)} for r in all_runs(mlflow_client, experiment.experiment_id, query)]
