"""Where prepare's Beam workers put what they make (`data.beam.staging`), and how the
driver takes it back and cleans up after itself and after earlier runs that were killed.

Workers share nothing with the driver but this place: they write shard parts, rows and
quarantine copies through Beam's filesystems (`FileSystems.create` under `base`, a string
handed to them), so the same code writes to the stage's local staging folder (the
default, for the in-process runner), to s3:// or gs://, or to a mount every worker
shares. Each run stages under its own prefix `<staging>/tfmlops-prepare-<UTC time>-<id>/`
with an owner marker in it (what made it, when, which machine and process); the driver
assembles data/prepared from there, streaming, and removes the prefix.

A driver killed outright (SIGKILL, a lost machine) cannot remove its prefix: a later run
removes stale prefixes it owns. Stale: the marker is ours (kind and name), its run began
before this one, and nobody holds it: its process is gone (same machine), or its marker
has not been rewritten for `LEASE` seconds (the driver rewrites it every `HEARTBEAT`; the
store's clock judges both times, so two machines' clocks need not agree). Nothing without
the marker is touched, nor anything else under the staging URL; the marker goes last, so
a cleanup cut short leaves a prefix the next run still recognises.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from tfmlops.files import machine_id, pid_alive

log = logging.getLogger(__name__)

KIND = "tfmlops prepare beam staging"
MARKER = "tfmlops-prepare.owner"  # in each run's prefix
PREFIX = re.compile(r"tfmlops-prepare-(?P<time>\d{8}T\d{12}Z)-(?P<id>[0-9a-f]{12})")
# a URL or path under a run's prefix: (the prefix, the name inside it)
IN_RUN = re.compile(r"(?P<base>.*?" + re.sub(r"\(\?P<\w+>", "(", PREFIX.pattern) + r")[/\\](?P<name>.+)")
HEARTBEAT = 60.0  # s between rewrites of a live run's marker
LEASE = 15 * 60.0  # s without a rewrite after which another machine's prefix is stale
CHUNK = 1 << 20  # bytes per read when copying a staged file


def check_staging(cfg, runner: str) -> None:
    """`data.beam.staging` for `runner` (valid: pipeline_options checked it): a remote one
    (any but the in-process DirectRunner; a PortableRunner on this machine's job service
    too) runs its workers elsewhere, so they need a place both sides reach, and they read
    data.image_dir from their own machine. Checked before any image is read."""
    from tfmlops.errors import ConfigError

    if runner.rsplit(".", 1)[-1].lower() in ("directrunner", "direct"):
        return
    if not cfg.data.beam.staging:
        raise ConfigError(f"data.beam.staging is required for --runner={runner}: set it to "
                          "s3://BUCKET/PATH, gs://BUCKET/PATH or the absolute path of a mount "
                          "every worker shares (its workers write there, not to this machine)")
    image_dir = str(cfg.data.image_dir)
    if "://" not in image_dir and not image_dir.startswith("/"):
        raise ConfigError(f"data.image_dir {image_dir} is relative, and --runner={runner}'s "
                          "workers read it from their own machine: give an s3:// or gs:// URL "
                          "or the absolute path of a mount every worker shares")


def on_workers(fn, flags: list[str]):
    """`fn` for a Beam transform, with Beam's filesystems given `flags` (the pipeline's
    options: an S3 endpoint, a region) in the worker before it runs: an external worker
    pool starts its SDK workers with no pipeline options, and Beam's S3 filesystem
    refuses to work without them ("Must provide one of client or options"). A function,
    not a `functools.partial`: Beam's FlatMap hands a partial its element alone."""
    flags = tuple(flags)

    def with_options(*args, **kwargs):
        return _with_options(flags, fn, *args, **kwargs)

    return with_options


def _with_options(flags: tuple[str, ...], fn, *args, **kwargs):
    global _options_set
    if _options_set != flags:
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions

        FileSystems.set_options(PipelineOptions(list(flags)))
        _options_set = flags
    return fn(*args, **kwargs)


_options_set: tuple[str, ...] | None = None  # in this worker process


def is_local(url: str) -> bool:
    return "://" not in url


def join(base: str, *names: str) -> str:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.join(base, *names)


def create(url: str):
    """A write channel to `url` through Beam's filesystems, bytes as given (Beam would
    otherwise compress a name ending in .gz or .bz2). Under a run's prefix whose marker
    is gone it refuses: a job its driver cancelled may go on running (Beam 2.77's local
    job service marks a job CANCELLED and does not stop it), and its workers must not
    write under a prefix the driver has removed (nothing would ever remove those files).
    What is left is the moment between this check and the write's end."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    inside = IN_RUN.match(url)
    if inside and inside["name"] != MARKER and not FileSystems.exists(
            join(inside["base"], MARKER)):
        from tfmlops.errors import DataError

        raise DataError(f"staging prefix {inside['base']} is gone (its run was cancelled or "
                        f"has ended): not writing {inside['name']}")
    return FileSystems.create(url, compression_type=CompressionTypes.UNCOMPRESSED)


def open_staged(url: str):
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(url, compression_type=CompressionTypes.UNCOMPRESSED)


def literal(path: str) -> str:
    """`path` as a Beam match pattern that matches only itself: Beam has no quoting, but
    `[[]` is a class holding `[` alone (a folder named `runs[1]`)."""
    return re.sub(r"[\[*?]", lambda m: f"[{m.group(0)}]", path)


def listing(pattern: str) -> list[tuple[str, float]]:
    """(path, last modified by the store's clock) of the files matching `pattern`."""
    from apache_beam.io.filesystems import FileSystems

    found = FileSystems.match([pattern])[0].metadata_list
    return sorted((m.path, m.last_updated_in_seconds) for m in found)


class RunPrefix:
    """This run's prefix under `root`: made with its marker, kept alive by a heartbeat
    while the run lasts, removed by `remove` (or by a later run, if this one is killed)."""

    def __init__(self, root: str, now: datetime | None = None):
        now = now or datetime.now(UTC)
        self.root = os.path.abspath(root) if is_local(root) else root.rstrip("/")
        self.name = f"tfmlops-prepare-{now:%Y%m%dT%H%M%S%f}Z-{uuid.uuid4().hex[:12]}"
        self.base = join(self.root, self.name)
        self.marker = join(self.base, MARKER)
        host, machine = machine_id()
        self.owner = {"kind": KIND, "run": self.name, "created": now.isoformat(),
                      "host": host, "machine": machine, "pid": os.getpid()}
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self) -> RunPrefix:
        from tfmlops.errors import DataError

        try:
            with _root_logger_quiet():  # Beam's S3 writer logs a traceback on the root logger
                self._write_marker()
        except Exception as exc:  # noqa: BLE001 - the store's own error, in one line
            raise DataError(f"data.beam.staging {self.root} cannot be written "
                            f"({error_line(exc)}); check "
                            "the URL and the credentials in the environment (AWS_ACCESS_KEY_ID "
                            "... or AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS)") from None
        self._beat = threading.Thread(target=self._heartbeat, name="staging-heartbeat",
                                      daemon=True)
        self._beat.start()
        return self

    def _write_marker(self) -> None:
        with create(self.marker) as fh:
            fh.write((json.dumps(self.owner, sort_keys=True) + "\n").encode())

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            with contextlib.suppress(Exception):  # a missed beat: the lease is 15 of them
                self._write_marker()

    def files(self, pattern: str) -> list[str]:
        """The staged files under this prefix matching `pattern` (relative to it)."""
        return [path for path, _ in listing(join(literal(self.base), pattern))]

    def relative(self, url: str) -> str:
        """`url` (a staged file) relative to this prefix, with '/' separators."""
        return url[len(self.base):].lstrip("/").replace(os.sep, "/")

    def fetch(self, url: str, target: Path) -> None:
        """Copy the staged file `url` to `target`, a chunk at a time (a local staging
        folder on the same disk: renamed)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_local(url):
            with contextlib.suppress(OSError):
                os.replace(url, target)
                return
        with open_staged(url) as src, open(target, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)

    def remove(self) -> None:
        """Remove this run's prefix; one that cannot be (the store unreachable) is said in
        one line and left for a later run (`remove_stale`)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            remove_prefix(self.base, self.marker)
        except Exception as exc:  # noqa: BLE001 - not to hide why the run ended
            log.warning("prepare: could not remove its Beam staging prefix %s (%s); the next "
                        "run removes it", self.base, str(exc).splitlines()[0][:200])


@contextlib.contextmanager
def _root_logger_quiet():
    """Nothing logged on the root logger gets out for the block (logging.error() would
    also configure it, printing every later record); the caller says what failed."""
    root = logging.getLogger()
    added = None if root.handlers else logging.NullHandler()
    root.addFilter(_drop)
    if added:
        root.addHandler(added)
    try:
        yield
    finally:
        root.removeFilter(_drop)
        if added:
            root.removeHandler(added)


def _drop(record: logging.LogRecord) -> bool:
    return False


def remove_prefix(base: str, marker: str) -> None:
    """Every file under `base` (a run's prefix), its marker last."""
    from apache_beam.io.filesystems import FileSystems

    if is_local(base):  # Beam's local delete reads each name as a glob: `a[1].jpg` fails
        if os.path.isdir(base) and not os.path.islink(base):
            for entry in os.scandir(base):
                if entry.name != MARKER:
                    (shutil.rmtree if entry.is_dir(follow_symlinks=False) else os.unlink)(entry.path)
            shutil.rmtree(base)
        return
    # S3 deletes keys as given; GCS (like the local filesystem) matches each as a pattern
    named = (lambda paths: paths) if base.startswith("s3://") else \
        (lambda paths: [literal(p) for p in paths])
    staged = [path for path, _ in listing(join(literal(base), "**")) if path != marker]
    if staged:
        FileSystems.delete(named(staged))
    with contextlib.suppress(Exception):  # already gone: another cleaner was first
        FileSystems.delete(named([marker]))
    with contextlib.suppress(Exception):  # written meanwhile, before the writers saw the
        late = [path for path, _ in listing(join(literal(base), "**"))]  # marker go (create)
        if late:
            FileSystems.delete(named(late))


def stale_prefixes(root: str, own: RunPrefix) -> list[str]:
    """The prefixes under `root` a run may remove: its kind's name, our marker (kind and
    run name inside), begun before `own`, and nobody holding them (module docstring)."""
    root = os.path.abspath(root) if is_local(root) else root.rstrip("/")
    began = PREFIX.fullmatch(own.name)["time"]
    try:
        markers = listing(join(literal(root), "tfmlops-prepare-*", MARKER))
    except Exception:  # noqa: BLE001 - nothing listed (no such folder yet): nothing stale
        return []
    now = dict(markers).get(own.marker)
    if now is None:  # our own marker's time by the store's clock: the lease's reference
        return []
    stale = []
    for marker, beaten in markers:
        base = marker[:-len(MARKER)].rstrip("/\\")
        name = base[len(root):].strip("/\\")
        m = PREFIX.fullmatch(name)
        if m is None or m["time"] >= began:
            continue  # not a prefix name we give, this run's own, or begun after it
        if is_local(root) and os.path.islink(base):
            continue  # a link to somewhere else: not a folder we made
        owner = _owner(marker)
        if owner is None or owner.get("kind") != KIND or owner.get("run") != name:
            continue
        held = now - beaten < LEASE
        if (owner.get("host"), owner.get("machine")) == (own.owner["host"], own.owner["machine"]):
            held = held and pid_alive(int(owner.get("pid", 0)))
        if not held:
            stale.append(base)
    return stale


def remove_stale(root: str, own: RunPrefix) -> list[str]:
    """Remove the stale prefixes under `root` (`stale_prefixes`); the ones removed."""
    removed = []
    for base in stale_prefixes(root, own):
        try:
            remove_prefix(base, join(base, MARKER))
        except Exception as exc:  # noqa: BLE001 - left for the next run, said in one line
            log.warning("prepare: could not remove the stale Beam staging prefix %s (%s); the "
                        "next run tries again", base, str(exc).splitlines()[0][:200])
            continue
        removed.append(base)
    if removed:
        log.info("prepare: removed %d stale Beam staging prefix(es) of killed runs under %s",
                 len(removed), root)
    return removed


def _owner(marker: str) -> dict | None:
    try:
        with open_staged(marker) as fh:
            owner = json.loads(fh.read(4096))
    except Exception:  # noqa: BLE001 - unreadable or not JSON: not ours
        return None
    return owner if isinstance(owner, dict) else None


def stamp(now: float | None = None) -> str:
    """A UTC time as a prefix name gives it (for tests that plant old prefixes)."""
    return datetime.fromtimestamp(time.time() if now is None else now,
                                  UTC).strftime("%Y%m%dT%H%M%S%fZ")


@contextlib.contextmanager
def pipeline(options, deadline_s: float = 0):
    """A Beam pipeline to build in the block, run at its end: waited for at most
    `deadline_s` seconds (0: no limit), and cancelled when not finished by then or when
    the wait is cut (an error, Ctrl-C, SIGTERM), so a remote job does not go on writing
    under a prefix its driver is about to remove. A deadline matters on a remote runner:
    when an external SDK worker dies, Beam 2.77's local job service fails the job or, by
    where the worker was, waits for it forever (both seen); the in-process runner returns
    only once done, so the deadline does not apply to it."""
    import apache_beam as beam
    from apache_beam.runners.runner import PipelineState

    from tfmlops import faults
    from tfmlops.errors import DataError

    p = beam.Pipeline(options=options)
    yield p
    result = p.run()
    try:
        faults.point("beam.submitted")  # the driver killed or stopped with its job running
        state = result.wait_until_finish(duration=int(deadline_s * 1000) or None)
    except BaseException:
        _cancel(result)
        raise
    if state != PipelineState.DONE:
        _cancel(result)
        raise DataError(f"prepare on Apache Beam did not finish within data.beam.deadline_s "
                        f"({deadline_s:g} s; state {state}): cancelled, nothing was swapped in (a "
                        "worker may have died: Beam's local job service can wait for it "
                        "forever); run it again, or raise data.beam.deadline_s")


def _cancel(result) -> None:
    with contextlib.suppress(Exception):  # the runner's own cancel; it may be done already
        result.cancel()


def error_line(exc: BaseException) -> str:
    """The last line of an error's message (a store's or Beam's runs to pages), cut."""
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]
