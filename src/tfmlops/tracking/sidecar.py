"""A stage's MLflow run kept in a separate process, so tracking costs the stage little.

Importing MLflow, its SQLite store and logging a model cost seconds of CPU
(BENCHMARKS.md, figures behind the code): in a thread of the training process that is
work under the GIL, and `train` got measurably slower. TensorFlow leaves part of 2 cores
idle while it trains and one while it imports: a second process does the work there, and
the training process never imports MLflow.

- `SidecarRun` (the stage's side): the `StageRun` interface, calls sent over a pipe that
  return at once; nested runs (`SidecarChild`, tune's trials) are opened by the sidecar.
  The model goes as its saved file plus `keras_file.describe`. The run's opening, the
  model's logging, a `perform` and the end are waited for: the run file is written
  before the outputs move, a model that cannot be logged fails the stage, and the stage
  ends only when everything is in the store or queued in the outbox.
- `serve()` (the sidecar process, `main`): replays every call into a `stage_run`, with
  its retries, outbox and orphan rule. Its log records are sent back to the stage's
  loggers. If the stage dies, the pipe closes and the run ends KILLED.

A stage may hand its run over and exit before it is in the store (`detach`: prepare,
`tracking.wait: false`). It takes its delivery lock (artifacts.DELIVERY_LOCK) at its
start, keeps its calls, and at its end writes them to the outbox (handover.py: a file
write, so a sidecar killed with the stage's container loses nothing), then starts the
sidecar, handing it the lock, which it holds until it exits: the two never share the
cores or add up in memory. That sidecar replays the outbox file
(outbox.deliver_handed_over), logs to `tracking.log`, runs niced and leaves the stage's
process group. A later stage reading the run file waits for the lock first
(lineage.read_run_file). Logged files are hard-linked when logged, so a later run of the
stage that replaces them cannot change what this one uploads; the links are in the
project (`.tfmlops/scratch/`, or the outbox for a run handed over), on the outputs'
filesystem, where a link is not a copy.

A rerun started while the previous run's sidecar still delivers does not wait for it
(issue 50: that wait was most of a +1% prepare started at once): it holds the queue
lock beside the delivery lock (artifacts.DELIVERY_QUEUE, shared) instead, so readers
wait for it too, does its work, hands its run over, and its sidecar takes the delivery
lock once the earlier one lets go (`_await_turn`), then delivers. The earlier sidecar
reads only its own outbox file and hard links, and settles only a run file that still
names its run: the rerun may replace the outputs meanwhile. The outbox replays runs in
the order they were handed over (handover.py), so a sidecar killed in the queue, or
whichever sidecar gets the lock first, still sends them in order.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import pickle
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tfmlops import faults
from tfmlops.artifacts import DELIVERY_QUEUE, DETACHED_LOG, SCRATCH
from tfmlops.errors import TrackingUnavailable
from tfmlops.files import link_or_copy
from tfmlops.tracking import keras_file
from tfmlops.tracking.handover import Handover
from tfmlops.tracking.naming import experiment_id_of
from tfmlops.tracking.outbox import deliver_handed_over
from tfmlops.tracking.retry import first_line
from tfmlops.tracking.run import StageRun, ending, stage_run, warn_queued
from tfmlops.tracking.uri import ensure_reachable, is_chief, tracking_uri, use_uri

log = logging.getLogger(__name__)

# Once its run is open, the sidecar yields to the stage: what is left (metrics, the
# model at the end) takes the cores TensorFlow leaves idle. Not before: on a loaded
# machine the run would open only after training, with no live metrics.
NICENESS = 10
# Not `-m`: the package imports this module before runpy would run it.
_MAIN = "import sys; from tfmlops.tracking.sidecar import main; sys.exit(main(sys.argv[1:]))"
_EOF = ("eof", None)
# How often a stage waiting for a reply checks that the sidecar can still send one.
REPLY_POLL_S = 0.5
# A sidecar that exited may have replies still in the pipe: read for this long first.
EXIT_GRACE_S = 5.0
# At the run's end the sidecar exits once it ended the run (a model may still upload):
# past this, the stage kills it; the run is then closed as stale (stale.py).
END_WAIT_S = 120.0
# Replies after which no other comes: the stage raises (`_Process.reply`).
_ENDS_REPLIES = {"unavailable", "failed", "reader failed", "unreadable", _EOF[0]}


class SidecarGone(TrackingUnavailable):
    """The tracking sidecar can no longer answer (it exited, or our reader thread failed)."""


def _send(conn: Connection, kind: str, body: Any) -> None:
    conn.send_bytes(pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL))


def _messages(conn: Connection) -> Iterator[tuple[str, Any]]:
    """The messages a pipe brings, then _EOF once its other end is closed. One that
    cannot be unpickled (a bug) comes as ("unreadable", why), and reading goes on: the
    reader must not die silently with its peer waiting."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            yield _EOF
            return
        try:
            yield pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - named to the reader's peer
            yield ("unreadable", f"{type(exc).__name__}: {first_line(exc)}")


_early: dict[str, Any] = {"process": None}


def start_sidecar(cfg, hold: Path | None = None) -> None:
    """Spawn the sidecar now, at a stage's start: it imports MLflow while the stage
    imports TensorFlow (one core is idle then); `sidecar_run` takes it over. `hold`: the
    delivery lock of a stage that may detach."""
    if cfg.tracking.enabled and is_chief() and _early["process"] is None:
        _early["process"] = _Process(cfg, hold)


def discard_sidecar() -> None:
    """Close a sidecar `start_sidecar` spawned that no run took over (its stage failed first)."""
    process, _early["process"] = _early["process"], None
    if process is not None:
        process.discard()


@contextlib.contextmanager
def sidecar_run(cfg, stage: str, out_dir: str | Path, upstream: dict | None = None,
                params: dict[str, Any] | None = None, facts: dict[str, Any] | None = None,
                hold: Path | None = None) -> Iterator[StageRun]:
    """`stage_run`, with the run kept by a sidecar process; the store is checked here
    first, so a stage still fails within seconds when it is away. With `hold` (the
    delivery lock) a run that ends FINISHED is handed over, not waited for."""
    if not cfg.tracking.enabled or not is_chief():
        with stage_run(cfg, stage, out_dir, upstream, params, facts=facts) as run:
            yield run
        return
    ensure_reachable(tracking_uri(cfg), cfg.tracking.connect_timeout_s)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    early, _early["process"] = _early["process"], None
    # One spawned for an earlier stage that failed before its run (a library caller
    # running stages in one process) may have exited: a fresh one then.
    process = early if early is not None and early.alive() else _Process(cfg, hold)
    process.send("start", {"cfg": cfg, "stage": stage, "out_dir": str(out_dir), "facts": facts,
                           "upstream": upstream, "params": params,  # None: stage_run's default
                           "level": logging.getLogger("tfmlops").getEffectiveLevel()})
    run = SidecarRun(cfg, stage, process, detach_log=None if hold is None
                     else Path(hold).with_name(DETACHED_LOG))
    with ending(run):
        yield run


class _Process:
    """The sidecar process and its two pipes; log records it sends are logged here.
    With `hold` (a stage that hands its run over) the process starts only at the
    stage's end: the calls wait here until then."""

    def __init__(self, cfg, hold: Path | None = None):
        self.proc: subprocess.Popen | None = None
        self._hold = hold
        # the delivery lock (held unless queued) and the queue lock (held while queued)
        self._lock, self._queued = _delivery_turn(hold) if hold is not None else (None, None)
        self._pending: list[tuple[str, Any]] = []
        self._replies: queue.Queue = queue.Queue()
        self._gone: str | None = None  # why no reply can come any more, once known
        # replies read while waiting for another one: {(kind, nested run's key): body}
        self._early: dict[tuple[str, int | None], Any] = {}
        if hold is None:  # it imports MLflow at once (with `hold`, only as the run opens)
            self._launch()
            self.send("warm", {"uri": tracking_uri(cfg), "experiment": cfg.tracking.experiment})

    def _launch(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        if self._pending:  # written at once: a pipe this size (1 MiB) never blocks the stage on them
            with contextlib.suppress(OSError):
                fcntl.fcntl(to_child_w, fcntl.F_SETPIPE_SZ, 1 << 20)
        if self._queued is not None and _try_lock(self._lock):  # the earlier delivery ended meanwhile
            os.close(self._queued)
            self._queued = None
        lock, queued = self._lock, self._queued
        held = [] if lock is None else [lock] if queued is None else [lock, queued]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MAIN, str(to_child_r), str(from_child_w),
             *([] if lock is None else [str(lock), str(self._hold.with_name(DETACHED_LOG)),
                                        "-" if queued is None else str(queued)])],
            # The stage's stdout is its JSON result: nothing else may write there.
            pass_fds=(to_child_r, from_child_w, *held),
            stdout=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        for fd in held:  # the sidecar's copies keep the locks until it lets go of them
            os.close(fd)
        self._lock = self._queued = None
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        self._reader = threading.Thread(target=self._read, name="tfmlops-sidecar", daemon=True)
        self._reader.start()
        pending, self._pending = self._pending, []
        for kind, body in pending:
            self.send(kind, body)

    @property
    def pending(self) -> list[tuple[str, Any]]:
        """The calls kept for a sidecar not started yet (`hold`)."""
        return self._pending

    def launched(self) -> _Process:
        if self.proc is None:
            self._launch()
        return self

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def send(self, kind: str, body: Any) -> None:
        if self.proc is None:
            self._pending.append((kind, body))
            return
        with contextlib.suppress(OSError):  # the sidecar is gone: its reason comes with the next reply
            _send(self._out, kind, body)

    def close(self) -> None:
        self.launched()._out.close()

    def discard(self) -> None:
        """Close a sidecar no run took over (one never started lets its lock go)."""
        if self.proc is None:
            for fd in (self._lock, self._queued):
                if fd is not None:
                    os.close(fd)
            self._lock = self._queued = None
            return
        self._out.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def _read(self) -> None:
        """Log records as they come; every other reply, or this thread's failure, to the stage."""
        try:
            for kind, body in _messages(self._in):
                if kind == "log":
                    logging.getLogger(body.name).handle(body)
                else:
                    self._replies.put((kind, body))
        except BaseException as exc:  # noqa: BLE001 - handed to the stage, which raises it
            self._replies.put(("reader failed", f"{type(exc).__name__}: {first_line(exc)}"))

    def reply(self, expected: str, child: int | None = None) -> Any:
        """The sidecar's reply `expected` (`child`: that nested run's key; its reply may
        have come among others); SidecarGone within seconds if none can come."""
        self.launched()
        wanted = (expected, child)
        while wanted not in self._early:
            kind, body = self._next_reply()
            if kind in _ENDS_REPLIES:
                break
            # kept for their own waits (a nested run's id is read whenever it is)
            key, body = ((kind, body[0]), body[1]) if kind == "child" else ((kind, None), body)
            self._early[key] = body
        else:
            return self._early.pop(wanted)
        if kind == "unavailable":
            raise TrackingUnavailable(body)
        if kind == "failed":
            raise RuntimeError(body)
        if kind in ("reader failed", "unreadable"):
            self._gone = (f"reading the tracking sidecar's replies failed ({body}) before "
                          f"`{expected}`")
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(EXIT_GRACE_S)
            self._gone = (f"the tracking sidecar exited (code {self.proc.returncode}) before "
                          f"`{expected}`; its log is above")
        # No reply will be read: close our end, so a sidecar still writing gets an error
        # (and exits once it ended the run) instead of blocking on a full pipe.
        self.close()
        if not self._reader.is_alive():  # a reader blocked on it keeps it: no fd reuse under it
            with contextlib.suppress(OSError):
                self._in.close()
        raise SidecarGone(self._gone)

    def _next_reply(self) -> tuple[str, Any]:
        """The next reply, or why none will come: the reader thread is gone, or the
        sidecar exited and nothing came from the pipe for EXIT_GRACE_S."""
        if self._gone is not None:
            raise SidecarGone(self._gone)
        exited_at = None
        while True:
            with contextlib.suppress(queue.Empty):
                return self._replies.get(timeout=REPLY_POLL_S)
            if not self._reader.is_alive():  # it may have put its last reply just now
                with contextlib.suppress(queue.Empty):
                    return self._replies.get_nowait()
                return ("reader failed", "its thread is gone")
            if self.proc.poll() is not None:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > EXIT_GRACE_S:
                    return _EOF


class _PipedRun(StageRun):
    """A run whose calls go down the sidecar's pipe, in order (`child`: a nested run's key)."""

    def __init__(self, cfg, stage: str, process: _Process, model_dir: Path,
                 child: int | None = None):
        super().__init__(cfg, stage, None, None)
        self._process, self._model_dir, self._child = process, model_dir, child

    @property
    def active(self) -> bool:
        return True

    def _do(self, op: str, payload: dict[str, Any]) -> None:
        self._process.send("do", (op, payload, self._child))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Log the file or folder as it is now: hard links the sidecar reads later,
        whatever replaces `path` meanwhile (a stage's next run)."""
        source = Path(path)
        if not source.exists():
            return
        kept = Path(tempfile.mkdtemp(dir=self._model_dir)) / source.name
        if source.is_dir():
            shutil.copytree(source, kept, copy_function=link_or_copy)
        else:
            link_or_copy(source, kept)
        super().log_artifact(kept, artifact_path)

    def _call(self, fn, op: str, payload: dict[str, Any]) -> bool:
        raise NotImplementedError(f"{op}: not available in a run kept by the tracking sidecar")


class SidecarRun(_PipedRun):
    """The stage's side of a run opened and recorded by the sidecar process."""

    def __init__(self, cfg, stage: str, process: _Process, detach_log: Path | None = None):
        # set: a FINISHED end hands the run over, through the outbox (module doc)
        self._handover = None if detach_log is None else Handover(cfg, stage)
        super().__init__(cfg, stage, process, self._handover.files if self._handover
                         else scratch_folder(cfg))
        if self._handover is None:  # the sidecar removes it as it exits too: a stage killed with -9 cannot
            process.send("scratch", str(self._model_dir))
        self._detach_log = detach_log
        self._children = itertools.count(1)

    def log_drawn(self, draw, args: tuple, artifact_path: str | None = None) -> None:
        self._process.send("draw", (draw, args, artifact_path))

    def perform(self, fn, *args):
        self._process.send("perform", (fn, args))
        done, value = self._process.reply("performed")
        if not done:
            raise value
        return value

    def start_child(self, name: str, tags: dict[str, Any] | None = None) -> SidecarChild:
        """A nested run opened by the sidecar: its calls follow the parent's on the same
        pipe, so they reach the store in the order they were made."""
        key = next(self._children)
        self._process.send("child", {"key": key, "name": name, "tags": tags})
        return SidecarChild(self, key)

    def start_keras_model(self, model, saved_path: str | Path | None = None,
                          input_example=None, **kwargs) -> SidecarModel:
        """Log `model` from `saved_path`, the file the stage just saved."""
        if saved_path is None or input_example is None or kwargs:
            raise ValueError("the tracking sidecar logs a model from its saved file and an "
                             "input example only")
        self.wait_open()  # the run file is in the stage's output folder before it moves
        link = self._model_dir / Path(saved_path).name
        link_or_copy(saved_path, link)
        self._process.send("model", keras_file.describe(model, input_example, link))
        return SidecarModel(self)

    def end(self, status: str = "FINISHED") -> None:
        """End the run and wait for the sidecar; a detaching stage's FINISHED run is handed over."""
        if status == "FINISHED" and self._hand_over():
            return
        started = time.perf_counter()
        try:
            self._process.send("end", status)
            self._process.close()
            self.wait_open()  # its reply comes first, if no model has waited for it
            result = self._process.reply("ended")
            log.debug("tracking sidecar: waited %.2f s for the run's end", time.perf_counter() - started)
            self.queued, self.errors = result["queued"], result["errors"]
        except Exception as exc:
            if status == "FINISHED":
                raise
            log.warning("tfmlops: MLflow run of %s not ended cleanly: %s", self.stage, exc)
        finally:
            ended = time.perf_counter()
            try:
                self._process.proc.wait(END_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("tfmlops: the tracking sidecar of %s did not exit %.0f s after the "
                            "run's end; killed", self.stage, END_WAIT_S)
                self._process.proc.kill()
                self._process.proc.wait()
            log.debug("tracking sidecar: exited %.2f s after the run's end", time.perf_counter() - ended)
            shutil.rmtree(self._model_dir, ignore_errors=True)

    def _hand_over(self) -> bool:
        """Write the finished run to the outbox, then start the sidecar that delivers it
        and return (handover.py); False (the stage waits instead) if the sidecar had to
        answer a call already (it runs the calls then) or the outbox cannot be written."""
        if self._handover is None or self._process.proc is not None:
            return False
        try:
            self._handover.write([*self._process.pending, ("end", "FINISHED")])
        except OSError as exc:
            log.warning("tfmlops: %s: cannot write its MLflow run to %s (%s); waiting for the "
                        "store instead", self.stage, self._handover.path, exc)
            return False
        self._process.pending.clear()  # in the outbox now: the sidecar reads them from there
        self._process.send("detach", None)
        self._process.send("deliver", {"cfg": self.cfg})
        self._process.close()
        log.info("%s: its MLflow run is in %s and goes to the store from a background "
                 "process (pid %d, log %s); later stages wait for it (if that process is "
                 "stopped, the next stage or `tfmlops sync` sends it)", self.stage,
                 self._handover.path, self._process.proc.pid, self._detach_log)
        return True

    def wait_open(self) -> None:
        """Wait until the run is open (its run file written); a detaching stage does not."""
        if self.run_id is None and self._detach_log is None:
            self.run_id = self._process.reply("opened")


class SidecarChild(_PipedRun):
    """A nested run the sidecar opened; its `run_id` comes from the sidecar when first read."""

    def __init__(self, parent: SidecarRun, key: int):
        self._id = None
        super().__init__(parent.cfg, parent.stage, parent._process, parent._model_dir, key)

    @property
    def run_id(self) -> str | None:
        if self._id is None:
            self._id = self._process.reply("child", self._child)
        return self._id

    @run_id.setter
    def run_id(self, value: str | None) -> None:
        self._id = value

    def start_child(self, name: str, tags: dict[str, Any] | None = None) -> StageRun:
        raise NotImplementedError("a nested run of the tracking sidecar has no nested runs")

    def end(self, status: str = "FINISHED") -> None:
        if self.ended is None:
            self.ended = status
            self._process.send("child_end", (self._child, status))


def _delivery_turn(path: Path) -> tuple[int, int | None]:
    """Open descriptors for the sidecar to inherit (a lock lives while any copy is open):
    the delivery lock at `path`, held, and None; or, while a previous run's sidecar still
    delivers, that lock not held yet and the queue lock beside it, held shared (module
    doc). Never waits for the previous delivery."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if _try_lock(fd):
        return fd, None
    queued = os.open(path.with_name(DELIVERY_QUEUE), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(queued, fcntl.LOCK_SH)  # readers hold it only for a moment (lineage.wait_delivered)
    log.info("tfmlops: the previous run's tracking sidecar is still delivering it (%s); this "
             "run goes to the store after it", path.with_name(DETACHED_LOG))
    return fd, queued


def _try_lock(fd: int) -> bool:
    """Whether the delivery lock `fd` is now held (exclusively), without waiting."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _await_turn(lock: int, queued: int) -> None:
    """The sidecar of a run queued behind an earlier delivery: wait until that one lets
    go of the delivery lock, take it, then leave the queue (readers wait on the lock now)."""
    if not _try_lock(lock):
        log.info("tfmlops: waiting for the previous run's delivery to end")
        fcntl.flock(lock, fcntl.LOCK_EX)
    os.close(queued)


def scratch_folder(cfg) -> Path:
    """A fresh folder for the hard links of what a run logs, on the project's filesystem
    (`.tfmlops/scratch/`, beside `paths.reports`): in the system's temp folder (a tmpfs,
    or a container layer under a bind-mounted repo) each link would be a full copy."""
    root = Path(cfg.paths.reports).resolve().parent / SCRATCH
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="tfmlops-model-", dir=root))


class SidecarModel:
    """A model the sidecar is logging: `wait(saved_path)` as `ModelLogging.wait`."""

    def __init__(self, run: SidecarRun):
        self._run: SidecarRun | None = run

    def wait(self, saved_path: str | Path | None) -> bool:
        """True once logged; False when the store is away (`saved_path` queued); else raises."""
        run, self._run = self._run, None
        if run is None:
            return False
        started = time.perf_counter()
        run._process.send("model_wait", None if saved_path is None else str(Path(saved_path).resolve()))
        sent = run._process.reply("model")
        log.debug("tracking sidecar: waited %.2f s for the model", time.perf_counter() - started)
        return sent


# ------------------------------------------------------------------ the sidecar's side

class _StageGone(KeyboardInterrupt):
    """A reply could not be sent: the stage died. Its run ends KILLED, as on the pipe's EOF."""


class _Replies(logging.Handler):
    """Log records of the sidecar, sent to the stage's process to be logged there."""

    def __init__(self, out: Connection):
        super().__init__()
        self.out = out
        self.lock_out = threading.Lock()
        self.detached = False  # the stage has gone on without us: nothing to send
        self.inbox_done = threading.Event()  # the stage's pipe is read to its end

    def send(self, kind: str, body: Any) -> None:
        with self.lock_out:  # log records come from MLflow's threads too
            if self.detached:
                return
            with contextlib.suppress(OSError):  # its pipe is closed: handed over, or the stage died
                _send(self.out, kind, body)
                return
        # A stage that handed its run over wrote `detach` before its pipe's end.
        self.inbox_done.wait(EXIT_GRACE_S)
        if not self.detached:
            raise _StageGone()  # died: its run ends KILLED

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        record.exc_info = record.exc_text = None
        with contextlib.suppress(Exception, _StageGone):  # the stage is gone; nothing to tell
            self.send("log", record)


def _inbox(conn: Connection, replies: _Replies, on_detach: Callable[[], None]) -> queue.Queue:
    """Read the stage's calls as they come, so its writes never wait on the pipe. A
    `detach` takes effect (and `on_detach` runs) at once: the main thread may still be
    importing MLflow."""
    calls: queue.Queue = queue.Queue()

    def read() -> None:
        for kind, body in _messages(conn):
            if kind == "scratch":
                _scratch.append(body)
            elif kind == "detach":
                replies.detached = True
                # Out of the stage's process group and terminal: a Ctrl-C or a group
                # SIGTERM meant for the next stage must not end this finished run KILLED.
                with contextlib.suppress(OSError):
                    os.setsid()
                on_detach()
            else:
                calls.put((kind, body))
        replies.inbox_done.set()

    threading.Thread(target=read, name="tfmlops-sidecar-inbox", daemon=True).start()
    return calls


_scratch: list[str] = []  # the stage's hard links: removed once the run has ended


def _log_to_file(path: Path, fresh: bool = True) -> Callable[[], None]:
    """The run's log records go to `path` (emptied first if `fresh`; a sidecar queued
    behind another appends to its log), warnings to stderr too; returns what to do
    once the stage has gone on (nothing if `path` cannot be written)."""
    logger = logging.getLogger("tfmlops")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    to_stderr = logging.StreamHandler()
    to_stderr.setLevel(logging.WARNING)
    logger.addHandler(to_stderr)
    try:
        if fresh:
            path.write_bytes(b"")
        # Appending: stderr may be pointed at the same file (let_go_of_a_piped_stderr).
        to_file = logging.FileHandler(path, mode="a")
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(to_file)
    except OSError as exc:  # its folder is gone: the warnings still reach the terminal
        log.warning("tfmlops: cannot write %s (%s); delivering without it", path, exc)
        return lambda: None

    def let_go_of_a_piped_stderr() -> None:
        """A sidecar whose stderr is a pipe (`tfmlops prepare 2>&1 | tee log`, a CI runner,
        `capture_output=True`) would keep its reader waiting until the run is delivered,
        minutes during an outage: its stderr goes to tracking.log instead. A terminal or
        a file keeps it: nobody waits for their end."""
        with contextlib.suppress(OSError):
            mode = os.fstat(sys.stderr.fileno()).st_mode
            if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                return
            logger.removeHandler(to_stderr)  # the file has them
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            sys.stderr.flush()
            os.dup2(fd, sys.stderr.fileno())
            os.close(fd)

    return let_go_of_a_piped_stderr


def serve(calls: queue.Queue, replies: _Replies, hands_over: bool = False) -> None:
    """Open the stage's run and replay its calls into it until it ends."""
    kind, start = calls.get()
    if kind == "warm":  # MLflow imported and the experiment found (or made) before the run is asked for
        with contextlib.suppress(Exception):  # the run's opening raises it, if it is still there
            experiment_id_of(use_uri(start["uri"]), start["experiment"], start["uri"])
        kind, start = calls.get()
    if kind == "deliver":  # a run handed over: it is in the outbox
        faults.point("sidecar.end")  # a test holds a detached delivery here (SIGSTOP)
        deliver_handed_over(start["cfg"])
        _exit_now()
    if kind != "start":  # the stage ended before it opened its run
        return
    logger = logging.getLogger("tfmlops")
    if not hands_over:
        logger.addHandler(replies)
        logger.setLevel(start["level"])
        logger.propagate = False
    try:
        with stage_run(start["cfg"], start["stage"], start["out_dir"], start["upstream"],
                       start["params"], facts=start["facts"]) as run:
            replies.send("opened", run.run_id)
            _yield_cpu()
            run.end(_replay(run, calls, replies))  # every call sent, its end written
            warn_queued(run, tracking_uri(run.cfg))
            replies.send("ended", {"queued": run.queued, "errors": run.errors})
            _exit_now()
    except KeyboardInterrupt:  # the stage is gone: stage_run ended its run KILLED
        pass
    except TrackingUnavailable as exc:
        if replies.detached:
            log.error("tfmlops: %s: its MLflow run was not delivered: %s", start["stage"], exc)
        replies.send("unavailable", str(exc))


def _exit_now() -> None:
    """Exit now: what stage_run and the interpreter would do next saves nothing more, and
    the teardown with MLflow loaded took 1.7 s that the stage (or a reader of a detached
    run, waiting for the delivery lock) waited for."""
    for folder in _scratch:
        shutil.rmtree(folder, ignore_errors=True)
    logging.shutdown()  # a detached run's tracking.log
    sys.stderr.flush()
    os._exit(0)


def _yield_cpu() -> None:
    """Run at NICENESS from now on (once: nice values add up)."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) < NICENESS:
            os.nice(NICENESS)


def _replay(run: StageRun, calls: queue.Queue, replies: _Replies) -> str:
    """Apply the stage's calls until it ends the run; the status it ended with."""
    job = None
    children: dict[int, StageRun] = {}
    try:
        while True:
            kind, body = calls.get()
            if kind == "do":
                op, payload, child = body
                (run if child is None else children[child])._do(op, payload)
            elif kind == "child":
                nested = children[body["key"]] = run.start_child(body["name"], body["tags"])
                replies.send("child", (body["key"], nested.run_id))
            elif kind == "child_end":
                children.pop(body[0]).end(body[1])
            elif kind == "draw":
                run.log_drawn(*body)
            elif kind == "perform":
                replies.send("performed", _performed(run, *body))
            elif kind == "model":
                job = run.start_saved_keras_model(body)
            elif kind == "model_wait":
                try:
                    replies.send("model", job.wait(body))
                except Exception as exc:  # noqa: BLE001 - raised in the stage, not here
                    replies.send("failed", f"logging the model failed: {exc}")
                job = None
            elif kind == "end":
                return body
            elif kind == "unreadable":  # a bug, not the stage's death: the run ends FAILED
                raise RuntimeError(f"a call from the stage could not be read ({body})")
            else:  # the stage is gone without ending its run
                raise KeyboardInterrupt
    finally:
        for nested in children.values():
            nested.end("KILLED")


def _performed(run: StageRun, fn, args: tuple) -> tuple[bool, Any]:
    """(True, `fn(run, *args)`), or (False, what it raised) for the stage to raise: as
    raised if it survives a pickle round trip (a UserError keeps its exit code), else its
    line. A round trip, not a dump alone: an exception whose __init__ takes other
    arguments pickles but fails to load, which would end the stage as unreadable."""
    try:
        return True, fn(run, *args)
    except Exception as exc:  # noqa: BLE001 - raised in the stage, not here
        try:
            return False, pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            return False, RuntimeError(f"{type(exc).__name__}: {first_line(exc)}")


def main(argv: list[str]) -> int:
    # A SIGTERM to the whole process group (CI cancel, a pod deleted) must not end this
    # process before its stage: the stage ends the run KILLED through it, and this
    # process ends the run KILLED itself when the stage is gone (its pipe closes).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    replies = _Replies(Connection(int(argv[1]), readable=False))
    # argv[2]: the delivery lock's descriptor, held (open) until this process exits, the
    # kernel freeing it however it exits; argv[3]: tracking.log; argv[4]: the queue
    # lock's descriptor if the lock is not held yet ("-" if it is)
    hands_over = len(argv) > 2
    queued = int(argv[4]) if hands_over and argv[4] != "-" else None
    on_detach = _log_to_file(Path(argv[3]), fresh=queued is None) if hands_over else lambda: None
    if hands_over:
        _yield_cpu()  # a stage that hands its run over shows no live metrics: from the start
    calls = _inbox(Connection(int(argv[0]), writable=False), replies, on_detach)
    if queued is not None:  # the inbox reads on meanwhile: a `detach` lets go of the stage's pipes
        _await_turn(int(argv[2]), queued)
    try:
        serve(calls, replies, hands_over)
    except (OSError, _StageGone):  # the stage is gone: its run already ended KILLED
        return 1
    except Exception as exc:  # noqa: BLE001 - reported to the stage, which raises it
        if replies.detached:
            log.exception("tfmlops: the tracking sidecar failed after its stage had gone on")
        with contextlib.suppress(_StageGone):  # the stage died meanwhile: nobody to tell
            replies.send("failed", f"the tracking sidecar failed: {type(exc).__name__}: {exc}")
        return 1
    finally:  # a run that ended removed them in `serve`, before its exit
        for folder in _scratch:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
