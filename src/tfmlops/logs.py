"""The `tfmlops` logger tree's setup, done once by the CLI, and TensorFlow's noise.

Every module logs through `logging.getLogger(__name__)`; nothing is configured
at import. A library user calling a stage's `run(cfg)` configures logging as
usual (`logging.basicConfig(level=logging.INFO)`, pytest's caplog) and sees the
same one-line messages the CLI shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

ROOT = "tfmlops"
STAGE_LOGS = ".tfmlops/logs"  # beside paths.reports: what other libraries said, per stage
QUIET, NORMAL, VERBOSE = -1, 0, 1
LEVELS = {QUIET: logging.WARNING, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}
# Python-side loggers of TensorFlow and absl: deprecation notices and warnings
# addressed to TensorFlow's developers, not to someone running a stage.
THIRD_PARTY = ("absl", "tensorflow")


class _StderrHandler(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a record is emitted (pytest swaps it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ assigns one: ignored
        pass


def configure(verbosity: int = NORMAL) -> None:
    """Messages on stderr (stdout carries the command's JSON result); call before TensorFlow loads.

    QUIET: warnings and errors only. NORMAL: the stages' one-line messages as
    they are, TensorFlow's C++ start-up notices hidden. VERBOSE: DEBUG with
    level and logger name, TensorFlow's own logs shown.
    """
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(old)  # a second call replaces, never doubles, the output
    handler = _StderrHandler()
    fmt = "%(levelname)s %(name)s: %(message)s" if verbosity >= VERBOSE else "%(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(LEVELS[max(QUIET, min(VERBOSE, verbosity))])
    # The CLI owns the process: a root handler added by some library must not print twice.
    logger.propagate = False
    if verbosity <= QUIET:
        # MLflow configures its own logger when imported (after this), from this variable.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if verbosity >= VERBOSE:
        return
    # A progress bar per downloaded file, redrawn on the terminal (`others_to` sends what
    # MLflow says to the stage's log; its bars it cannot).
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # oneDNN notices (INFO) and "failed call to cuInit ... (303)" (an ERROR record) on GPU-less
    # hosts: harmless, alarming; 2 hid the first but not the second under TF 2.21 here, so 3.
    # TensorFlow's real errors still reach the user as Python exceptions. Read once when its
    # C++ library loads: set before the import; a value the user exported wins.
    if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        # The variable does not reach the lines its libraries print while they load, before
        # absl's log is initialised ("oneDNN custom operations are on", "Could not find cuda
        # drivers"): the native stderr is silenced for the import of tensorflow alone.
        if not any(isinstance(f, _QuietImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _QuietImport())
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 on /dev/null for the block (what C++ libraries write to)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def children_stderr_to(path: str | os.PathLike):
    """File descriptor 2, which child processes inherit, on `path` for the block, while
    this process's `sys.stderr` (the tfmlops handler) stays where it was: processes a
    library starts (Beam's SDK workers log their start, options and shutdown) write to the
    file, the stage's own lines reach the user."""
    sys.stderr.flush()
    saved = os.dup(2)
    before = sys.stderr
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, errors="backslashreplace")
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = before
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def others_to(path: str | os.PathLike):
    """A stage run as a command (not -v): what other libraries say goes to `path`, the
    stage's own lines and Keras' progress stay on the terminal. To `path`: file
    descriptor 2 (TensorFlow's absl log, the TFLite converter's and LiteRT's notices, child
    processes), Python warnings (MLflow's and TensorFlow's UserWarnings) and MLflow's
    logger (its INFO lines). The file holds the last run's; a crash says where it is."""
    if logging.getLogger(ROOT).level <= logging.DEBUG:
        yield
        return
    # MLflow would put its own stderr handler on its logger when it is imported (later)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    taken = [logging.getLogger(name) for name in ("py.warnings", "mlflow")]
    before = [(lg.handlers[:], lg.propagate, lg.level) for lg in taken]
    logging.captureWarnings(True)
    for lg in taken:
        lg.handlers, lg.propagate = [handler], False
        lg.setLevel(logging.INFO)
    try:
        with children_stderr_to(path):
            yield
    except Exception as exc:
        from tfmlops.errors import UserError

        if not isinstance(exc, UserError):  # a crash: what the libraries said may explain it
            logging.getLogger(ROOT).error("what other libraries printed is in %s", path)
        raise
    finally:
        logging.captureWarnings(False)
        for lg, (handlers, propagate, level) in zip(taken, before, strict=True):
            lg.handlers, lg.propagate = handlers, propagate
            lg.setLevel(level)
        handler.close()


class _QuietImport:
    """Imports the top-level `tensorflow` package with the native stderr silenced; an
    import error still raises (and prints) once stderr is back. A meta path finder by
    its `find_spec` alone: importlib.abc's base class slows every start-up
    (BENCHMARKS.md, figures behind the code)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        import importlib.util
        sys.meta_path.remove(self)  # once, and the finders below find the real package
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def quiet_exec(module):
            with native_stderr_silenced():
                exec_module(module)

        spec.loader.exec_module = quiet_exec
        return spec


def quieted() -> bool:
    """True when the tfmlops logger was set above INFO (`-q`), not merely left unconfigured.

    Output that bypasses logging (Keras' progress bars, a redrawn progress line)
    follows `-q`, while a library user who configured nothing keeps seeing it.
    """
    return logging.getLogger(ROOT).level > logging.INFO
