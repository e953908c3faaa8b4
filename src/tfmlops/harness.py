"""Every stage's lifecycle, written once: a stage module holds only its own logic.

`stage(cfg, name, output=...)` is the block a stage does its work in. In order:
1. SIGTERM becomes `Terminated` (a KeyboardInterrupt) in the main thread, so a CI
   cancel, `timeout` or a deleted pod ends the stage as Ctrl-C does;
2. a tracked stage checks its store now (`tracking.preflight`: a dead server fails in
   seconds, before any work); `sidecar=True` spawns the run's process now, so it
   imports MLflow while the stage works (discarded if the stage fails before its run);
3. the output lock (`lock_path`: `.tfmlops/locks/<stage>.lock` in the project, chief
   only): two `tfmlops <stage>` on one repo outside DVC take turns, the second says
   so in one line and waits, so the folder swapped in is one run's;
4. an empty staging folder (`Stage.out`) the stage builds its output in;
5. the stage's MLflow run (`Stage.run`), opened on first use: a stage that fails
   before it (bad data) leaves no run; one that never used it gets it at the end
   (params, report). `sidecar=True`: kept by a separate process, see
   tracking/sidecar.py; `tracked=False`: a `NullRun`, for `materialize`;
6. on success: the staging folder swapped in whole (unless the stage did it with
   `Stage.swap()` to log from the final folder or to register after it), the
   profile folders it asked for logged, the run FINISHED, then `reports/<stage>.json`
   and its headline, `reports/metrics/<stage>.json` (the SPEC's `headline` keys: its
   DVC metrics file); a stage that did nothing (`Stage.skip`) opens no run and writes
   only these;
   on failure or a signal: the run FAILED or KILLED, the staging folder removed, the
   old output left in place, child processes of a pool stopped. A `detach` stage run
   as a command (prepare, `tracking.wait: false`) writes its FINISHED run to the outbox
   and returns: its sidecar delivers it after the process exits, or, if that is killed,
   the next stage or `tfmlops sync` (tracking/handover.py).
Each step visits its fault point (faults.STAGE_POINTS, as `<stage>.<point>`).
`run_command` turns what a command raised into one line and its exit code.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfmlops import faults
from tfmlops.artifacts import DELIVERY_LOCK, headline_path, report_path, run_dir
from tfmlops.errors import UserError
from tfmlops.files import hold_lock, read_json, staging_dir, swap_in, write_json

log = logging.getLogger(__name__)

LOCKS = ".tfmlops/locks"  # beside paths.reports: the stages' output locks (lock_path)
# Whether a `tfmlops` command's process runs the stage: it exits after it, so a stage
# that may `detach` hands its run over instead of waiting (a library caller waits).
_in_command: contextvars.ContextVar[bool] = contextvars.ContextVar("in_command", default=False)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: the stage ends as on Ctrl-C (run KILLED,
    staging removed, nothing swapped in)."""


@dataclass
class Stage:
    """What a stage's block works with; see the module docstring."""

    cfg: Any
    name: str
    out: Path | None  # the staging folder, None for a stage without an output folder
    final: Path | None  # where `out` is swapped in
    run_in_out: bool = True  # the run's `mlflow_run.json` goes into `out` (no `run_dir`)
    # more fields for `mlflow_run.json`, set before the run opens (prepare's data version)
    run_facts: dict = field(default_factory=dict)
    # the run's params, set before the run opens (train's, once TensorFlow is imported)
    params: dict | None = None
    scratch: bool = False  # a non-chief worker's: `out` is a scratch folder, removed at the end
    metrics: dict | None = None  # reports/<stage>.json (and its headline), once the run ended
    swapped: bool = False
    skipped: bool = False  # did nothing (`skip`): no run, no output swapped in
    _open: Callable[[], Any] | None = None  # opens the run, on the first use of `run`
    _run: Any = None
    _profiles: list[Path] = field(default_factory=list)
    _kept: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def run(self) -> Any:
        """The stage's MLflow run (a `StageRun`), opened now if it is not yet."""
        if self._run is None:
            self._run = self._open()
        return self._run

    def swap(self) -> Path:
        """Swap the staging folder in now (once): later calls log from the final folder.
        The run is open first if its `mlflow_run.json` moves in with the rest."""
        if not self.swapped:
            if self.run_in_out:
                self.run.wait_open()
            swap_in(self.out, self.final)
            self.swapped = True
        return self.final

    def report(self, metrics: dict, *, log_metrics: bool = True) -> dict:
        """The stage's metrics: logged to its run now, written to reports/<stage>.json at the
        end, the SPEC's headline keys of them to reports/metrics/<stage>.json."""
        self.metrics = metrics
        if log_metrics:
            self.run.log_metrics(metrics)
        return metrics

    def skip(self, metrics: dict) -> dict:
        """The stage did nothing (promote: no registry, or already decided): no run is
        opened, the output stays as it was, and reports/<stage>.json (and its headline) is
        written at the end only if it says something new (its `time` aside), so a no-op
        repro leaves it."""
        if self._run is not None:
            raise RuntimeError(f"{self.name}: skip after its run was opened")
        self.metrics, self.skipped = metrics, True
        return metrics

    def keep(self, files: list[tuple[Path, str]]) -> None:
        """Files the stage made, each with its artifact folder: logged to the run at the
        end of a successful block."""
        self._kept.extend(files)

    def profile_dir(self) -> Path:
        """A fresh profile folder for this run, logged as `profile` if it holds anything."""
        from tfmlops import profiling

        folder = profiling.fresh_profile_dir(self.cfg, self.name)
        self._profiles.append(folder)
        return folder

    @contextlib.contextmanager
    def trace(self) -> Iterator[Path | None]:
        """A TensorFlow Profiler trace of the block (`profiling.enabled`), logged at the end."""
        from tfmlops import profiling

        with profiling.trace(self.cfg, self.name) as folder:
            if folder is not None:
                self._profiles.append(folder)
            yield folder

    def _log_kept(self) -> None:
        for path, folder in self._kept:
            self.run.log_artifact(path, folder)
        if not self.cfg.profiling.enabled:
            return
        for folder in self._profiles:
            if folder.is_dir() and any(p.is_file() for p in folder.rglob("*")
                                       if p.name != ".tfmlops-owned"):
                self.run.log_artifact(folder, "profile")


@contextlib.contextmanager
def attached(cfg, spec, tags: dict[str, str], wait_s: float) -> Iterator[Stage]:
    """The block of a worker in another process's stage run (tune's distributed search):
    its work is recorded under that open run (found by `tags` within `wait_s`), which it
    never ends; it writes no output, holds no lock and writes no report. SIGTERM and a
    failure end it as they end a stage: children stopped, the error raised."""
    from tfmlops import tracking

    with terminated_on_sigterm():
        run = tracking.attach_run(cfg, spec.name, tags, wait_s=wait_s)
        try:
            yield Stage(cfg, spec.name, None, None, swapped=True, _open=lambda: run)
        except BaseException:
            _stop_children()
            raise


@contextlib.contextmanager
def stage(cfg, spec, *, params: dict | None = None) -> Iterator[Stage]:
    """The block a stage runs in (module docstring), shaped by its `spec` (a
    stage_spec.StageSpec): its output folder, the upstream stages its lineage names, whether
    it is tracked, by a sidecar, and may detach. A SPEC with `run_in_reports` keeps
    `mlflow_run.json` in reports/<name>/ (artifacts.run_dir) instead of the output
    folder. `detach`: run as a `tfmlops` command with `tracking.wait: false`, the stage
    hands its finished run to the sidecar and returns without waiting for the store. A
    SPEC with `worker_scratch`, off the chief of a distributed run, writes a scratch
    folder (`Stage.scratch`), removed at the end, instead of its output."""
    name, upstream, tracked, sidecar = spec.name, spec.upstream, spec.tracked, spec.sidecar
    runs_at = spec.run_dir(cfg) if spec.run_in_reports else None  # else: in the output
    output = spec.output_dir(cfg)
    scratch = spec.worker_scratch and output is not None and not _chief()
    with _scratch_folder(name) if scratch else contextlib.nullcontext(output) as output:
        final = Path(output) if output is not None else None
        hold = Path(runs_at) / DELIVERY_LOCK if _detaches(cfg, spec.detach and sidecar and tracked,
                                                        runs_at) else None
        with terminated_on_sigterm(), _tracking_ready(cfg, tracked, sidecar, hold), \
                _output_lock(cfg, name, None if scratch else final):
            out = final if scratch or final is None else staging_dir(final)
            runs = contextlib.ExitStack()  # the run, once opened: it ends as the block does

            def open_run():
                run = runs.enter_context(_run(cfg, name, runs_at or out, upstream,
                                              current.params, tracked, sidecar,
                                              current.run_facts, hold))
                faults.stage_point(name, "running")
                return run

            current = Stage(cfg, name, out, final, run_in_out=runs_at is None, swapped=scratch,
                            params=params, scratch=scratch, _open=open_run)
            try:
                yield current
                if current.skipped:
                    if out is not None and not scratch:
                        shutil.rmtree(out, ignore_errors=True)  # the output stays as it was
                else:
                    if out is not None and not current.swapped:
                        current.swap()
                    current.run.wait_open()  # one that never used its run gets it all the same
                    current._log_kept()
                runs.close()
            except BaseException as exc:
                try:  # the run ends FAILED or KILLED first, as today, then the rest is cleaned
                    runs.__exit__(type(exc), exc, exc.__traceback__)
                finally:
                    if out is not None and not scratch and not current.swapped:
                        shutil.rmtree(out, ignore_errors=True)  # the old output stays as it was
                    _stop_children()
                raise
            if current.metrics is not None:  # the run has ended; still under the lock
                _write_report(report_path(cfg.paths.reports, name), current.metrics,
                              only_if_new=current.skipped)
                if spec.headline:
                    _write_report(headline_path(cfg.paths.reports, name),
                                  spec.headline_of(current.metrics), only_if_new=current.skipped)
            faults.stage_point(name, "reported")


def _write_report(path: Path, metrics: dict, *, only_if_new: bool) -> None:
    if only_if_new and {**read_json(path, {}), "time": None} == {**metrics, "time": None}:
        return
    write_json(path, metrics)


def _chief() -> bool:
    from tfmlops.tracking import is_chief

    return is_chief()


@contextlib.contextmanager
def _scratch_folder(name: str) -> Iterator[Path]:
    """A non-chief worker's output folder (its checkpoints, history, traces): removed at
    the end, whatever happens."""
    with tempfile.TemporaryDirectory(prefix=f"tfmlops-{name}-worker-",
                                     ignore_cleanup_errors=True) as folder:
        yield Path(folder)


def _detaches(cfg, may: bool, run_dir) -> bool:
    """Whether the stage hands its finished run over instead of waiting for the store:
    one that may, as a `tfmlops` command, `tracking.wait: false`, not in a `dvc exp run`
    (DVC_EXP_NAME: its workspace may be a copy DVC removes as it ends, and its runs
    are compared right after)."""
    return (may and run_dir is not None and cfg.tracking.enabled and not cfg.tracking.wait
            and _in_command.get() and not os.environ.get("DVC_EXP_NAME"))


def lock_path(cfg, name: str) -> Path:
    """The output lock of stage `name`: one folder of the project (beside `paths.reports`;
    under `dvc exp run --temp`, in its copy), not beside the outputs DVC and tests see."""
    return Path(cfg.paths.reports).parent / LOCKS / f"{name}.lock"


@contextlib.contextmanager
def terminated_on_sigterm() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread for the block (elsewhere: as it was)."""
    previous = signal.getsignal(signal.SIGTERM)
    # Not the main thread (only it may set a handler), or nested (a stage run inside a
    # command's block): as it is.
    if threading.current_thread() is not threading.main_thread() or previous is _terminate:
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_command(command: str, work: Callable[[], Any], *, sigterm: bool = True) -> int:
    """Run one `tfmlops` command: its result as JSON on stdout, exit 0; a UserError as
    one line and its exit code (2); an interrupt or SIGTERM (`sigterm`) as one line and
    128 + signal. A None result prints nothing."""
    in_command = _in_command.set(True)
    try:
        with terminated_on_sigterm() if sigterm else contextlib.nullcontext():
            result = work()
    except UserError as exc:
        log.error("tfmlops %s: error: %s", command, exc)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        term = isinstance(exc, Terminated)
        log.error("tfmlops %s: stopped by %s; no output was recorded as done and its MLflow "
                  "run (if tracking is on) ended KILLED; run it again to redo it", command,
                  "SIGTERM" if term else "an interrupt (Ctrl-C)")
        return 128 + (signal.SIGTERM if term else signal.SIGINT)
    finally:
        _in_command.reset(in_command)
    if isinstance(result, dict) and result.get("exit_code"):
        return int(result["exit_code"])
    # The result is the command's output, not a log record: on stdout whatever -q/-v
    # say, so `tfmlops train | jq` and tests parse its last line.
    if result is not None:
        sys.stdout.write(json.dumps(result, default=str, sort_keys=True) + "\n")
    return 0


def _terminate(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _tracking_ready(cfg, tracked: bool, sidecar: bool, hold: Path | None) -> Iterator[None]:
    """Check the store now: a dead server fails in seconds, before the stage's work (its
    run opens later). With `sidecar`, spawn the run's process now (it imports MLflow
    meanwhile; it holds `hold`, the delivery lock, if set, or queues for it without
    waiting while an earlier run is still being delivered) and close it if the stage
    fails before its run took it over."""
    if tracked:
        from tfmlops import tracking

        tracking.preflight(cfg)
        if sidecar:
            tracking.start_sidecar(cfg, hold)
    try:
        yield
    except BaseException:
        if tracked and sidecar:
            tracking.discard_sidecar()  # a no-op once the run has taken it over
        raise


@contextlib.contextmanager
def _output_lock(cfg, name: str, final: Path | None) -> Iterator[None]:
    from tfmlops.tracking import is_chief

    # Other workers of a distributed run write scratch outputs and wait on the chief's
    # collectives: a lock they shared with it would deadlock them.
    if final is None or not is_chief():
        yield
        return
    lock = lock_path(cfg, name)
    with hold_lock(lock, f"{name}: another `tfmlops {name}` is writing {final} (it holds "
                         f"{lock}); waiting for it to finish"):
        faults.stage_point(name, "output_locked")
        yield


def _run(cfg, name, folder, upstream, params, tracked, sidecar, facts, hold):
    from tfmlops import tracking

    if not tracked:
        return contextlib.nullcontext(NullRun())
    upstream = {s: run_dir(cfg, s) for s in upstream}  # each stage's folder of its run file
    if sidecar:
        return tracking.sidecar_run(cfg, name, folder, upstream=upstream, params=params,
                                    facts=facts, hold=hold)
    return tracking.stage_run(cfg, name, folder, upstream=upstream, params=params,
                              facts=facts)


class NullRun:
    """The run of a stage that records nothing (`tracked=False`: materialize): every
    `StageRun` method is there and does nothing."""

    run_id = None
    active = False

    def __getattr__(self, name):
        from tfmlops.tracking import StageRun

        # StageRun's methods only: a misspelled one fails here as it would on a real run
        if name.startswith("_") or not callable(getattr(StageRun, name, None)):
            raise AttributeError(f"a stage's run has no method {name!r} (tracking.StageRun)")
        return lambda *args, **kwargs: None


def _stop_children() -> None:
    """Stop the multiprocessing children a failing stage left (a pool's workers): none
    outlives it. The train sidecar is a plain subprocess that ends its run first."""
    for child in multiprocessing.active_children():
        child.terminate()
    for child in multiprocessing.active_children():
        child.join(timeout=5)
