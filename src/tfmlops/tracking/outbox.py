"""The disk outbox: MLflow calls a run could not send, kept for `tfmlops sync`.

Each run that lost its store writes `reports/outbox/<stage>-<run id>[-<pid>].jsonl`,
one op per line (ops.py) naming its run and its store (the URI without credentials),
beside a `.files/` folder holding copies of the files those ops upload (stages move
their staging folders after logging), one uniquely named folder per entry. A child run
opened while the store was away is queued as a `create_run` line under a local id,
which `sync` replaces by the real id in the lines after it.

A stage that hands its finished run over (prepare, tracking.wait: false; handover.py)
writes the whole run to one file, `<stage>-pending-<local id>.jsonl` (the id starts with
the hand-over's time: `sync`'s name order is the order they were handed over), before it exits:
a `create_run` line without a parent (the run itself, under its experiment), its
calls, its end. A detached process replays it (`deliver_handed_over`); if that process
is killed with the stage's container or CI step, the next stage's run does it first
(run.stage_run), or `tfmlops sync`. A replay writes the run's id into the run file that
waits for it (lineage.settle_run_file) and removes what it sent: one run, however many
try (`_one_sync`; a replay killed midway finds its run again by its local id).

`sync` replays the files in order. What can never be sent (a line torn by a kill, a
call the store refuses, an artifact whose file is gone) is set aside in
`<name>.rejected` so it blocks nothing. Lines of another store are kept for a sync
against that store. A store that fails midway stops `sync`, which resumes there.

A stage may append while `sync` replays its file. Both take the file's lock (`_locked`):
the stage for each append, `sync` briefly twice: to read the file, and, after replaying
it, to write back what it keeps followed by the lines appended meanwhile. The stage
never waits for the store's replies, and no line is lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfmlops.config import Config
from tfmlops.errors import TrackingUnavailable
from tfmlops.files import write_bytes
from tfmlops.tracking.lineage import settle_run_file
from tfmlops.tracking.naming import experiment_id_of
from tfmlops.tracking.ops import PENDING, REFUSED, REPLAYABLE, Unsendable, apply, files_of
from tfmlops.tracking.retry import error_code, first_line
from tfmlops.tracking.stale import close_orphans, owner_tags
from tfmlops.tracking.uri import (
    ensure_reachable,
    import_mlflow,
    redact,
    tracking_uri,
    ui_url,
    use_uri,
)

log = logging.getLogger(__name__)

OUTBOX_DIR = "outbox"
OUTBOX_ID = "tfmlops.outbox_id"  # the tag of a run a replay created: its local id


def outbox_path(cfg: Config, name: str) -> Path:
    return Path(cfg.paths.reports) / OUTBOX_DIR / f"{name}.jsonl"


class Outbox:
    """One queue file and the copies of the files its entries name (a run's and its children's)."""

    def __init__(self, path: Path, store: str = ""):
        self.path = path
        self.store = redact(store)  # the store the run lives in

    def queue(self, run_id: str, op: str, payload: dict[str, Any]) -> str | None:
        """Queue one op (copying the file an `artifact` op names); the problem if it cannot be."""
        if op not in REPLAYABLE:
            return f"{op}: not sent and not replayable (the server was away)"
        if op == "artifact":
            source = Path(payload["path"])
            if not source.exists():
                return f"artifact {source}: gone before it could be queued"
            # Each entry's own folder, a uuid: a worker restarted under the same pid
            # appends to the same file, which may already hold its copies.
            folder = self.path.with_suffix(".files") / uuid.uuid4().hex
            folder.mkdir(parents=True)
            kept = folder / source.name
            try:
                if source.is_dir():
                    shutil.copytree(source, kept)
                else:
                    shutil.copy2(source, kept)
            except OSError as exc:  # shutil.Error too: a file gone or unreadable mid-copy
                shutil.rmtree(folder, ignore_errors=True)
                return f"artifact {source}: could not be copied to be queued ({first_line(exc)})"
            payload = {**payload, "path": str(kept)}
        self.write(run_id, op, payload)
        return None

    def write(self, run_id: str, op: str, payload: dict[str, Any]) -> None:
        """Append one op as it is (the files it names already belong to the outbox)."""
        self.write_all([(run_id, op, payload)])

    def write_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Append (run id, op, payload) entries in one write, on disk when this returns."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps({"run_id": run_id, "op": op, "payload": payload,
                                   "store": self.store}, default=str) + "\n"
                       for run_id, op, payload in entries)
        with _locked(self.path, create=True) as fd:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A line torn by a kill or a full disk: ended here, so this one is read
                # on its own (the torn one is set aside by `sync`), not glued onto it.
                text = "\n" + text
            os.write(fd, text.encode())
            os.fsync(fd)  # queued means on disk: the store is away, the run goes on


@contextlib.contextmanager
def _one_sync(folder: Path) -> Iterator[None]:
    """One `sync` at a time (two would send each call twice): a lock on the outbox
    folder itself, so no lock file is left in it once everything is sent."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("tfmlops: waiting for another replay of the outbox to finish "
                        "(`tfmlops sync`, or the delivery of a run handed over)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, create: bool) -> Iterator[int | None]:
    """The queue file `path`, open for appending and locked against its other writers;
    None if it does not exist and `create` is false. `sync` replaces the file by a
    rename while holding the lock: a writer that got the lock of the file it replaced
    opens the new one and waits for that one's lock instead."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            yield None
            return
        fcntl.flock(fd, fcntl.LOCK_EX)  # released as the fd closes, also by a kill
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)


def sync(cfg: Config, pattern: str = "*") -> dict[str, int]:
    """Replay every queued call in `reports/outbox/` (the files `<pattern>.jsonl`)
    against the current store, in order."""
    folder = Path(cfg.paths.reports) / OUTBOX_DIR
    files = sorted(folder.glob(f"{pattern}.jsonl")) if folder.is_dir() else []
    totals = {"files": len(files), "calls": 0, "rejected": 0, "other_store": 0}
    if not files:
        return totals
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    client = use_uri(uri).MlflowClient()
    with _one_sync(folder):
        for path in files:
            _Replay(client, path, uri, totals, cfg.tracking.retries + 1).run()
    return totals


def deliver_handed_over(cfg: Config) -> None:
    """Replay the runs stages handed over (module docstring): by the process a stage
    detached, or, if a kill stopped it, by the next stage's run before it opens (its
    lineage names them). A store that fails only warns: they wait for the next one."""
    try:
        totals = sync(cfg, f"*-{PENDING}*")
    except TrackingUnavailable as exc:
        log.warning("tfmlops: a finished run handed over was not delivered, it waits in %s "
                    "for the next stage or `tfmlops sync`: %s",
                    Path(cfg.paths.reports) / OUTBOX_DIR, exc)
        return
    if totals["calls"]:
        log.debug("tfmlops: %d calls of handed-over runs delivered", totals["calls"])


class _Replay:
    """The replay of one queue file, counted into `totals` (sync's)."""

    def __init__(self, client, path: Path, uri: str, totals: dict[str, int], attempts: int = 1):
        self.client, self.path, self.store, self.totals = client, path, redact(uri), totals
        self.uri, self.attempts = uri, attempts  # attempts: those the runs' owners gave each call
        self.ids: dict[str, str] = {}  # local id of a queued child run -> its real id
        self.rejected: list[dict[str, Any]] = []
        self.elsewhere: list[dict[str, Any]] = []  # lines of another store, kept
        self.taken = 0  # bytes of the file this replay read: what is after came meanwhile
        self.sent_files: list[Path] = []  # copies of artifacts sent, removed at the end

    def run(self) -> None:
        with _locked(self.path, create=False) as fd:
            if fd is None:  # gone since it was listed
                return
            data = self.path.read_bytes()
        self.taken = len(data)
        entries = self._read(data.decode(errors="replace"))
        for i, entry in enumerate(entries):
            if entry.get("store", self.store) != self.store:
                self.elsewhere.append(entry)
                continue
            entry = self._mapped(entry)
            try:
                self._send(entry)
                self.totals["calls"] += 1
                self.sent_files.extend(files_of(entry["op"], entry["payload"]))
            except Exception as exc:  # noqa: BLE001 - a refusal is set aside, anything else stops
                if error_code(exc) not in REFUSED:
                    self._finish([*self.elsewhere, *map(self._mapped, entries[i:])])
                    raise TrackingUnavailable(
                        f"sync stopped at {self.path.name} call {i + 1} ({entry['op']} of run "
                        f"{entry['run_id']}) on {self.store}: {first_line(exc)}; "
                        f"{self.totals['calls']} calls sent, {len(entries) - i} kept; fix "
                        "the store and run `tfmlops sync` again") from None
                # Unsendable is our own one-line message: kept whole (a long path would be
                # cut by first_line's limit, hiding "not sent").
                self._reject(entry, str(exc) if isinstance(exc, Unsendable)
                             else f"refused by {self.store}: {first_line(exc)}")
        self._finish(self.elsewhere)
        self.totals["rejected"] += len(self.rejected)
        self.totals["other_store"] += len(self.elsewhere)

    def _read(self, text: str) -> list[dict[str, Any]]:
        """The file's entries; a line that is not one (torn by a kill) is set aside."""
        entries = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not (isinstance(entry, dict) and {"run_id", "op", "payload"} <= entry.keys()):
                    raise ValueError("not an outbox entry")
            except ValueError as exc:
                self._reject({"line": line}, f"line {n} unreadable ({first_line(exc)}); "
                             "torn by a kill during the append?")
                continue
            entries.append(entry)
        return entries

    def _send(self, entry: dict[str, Any]) -> None:
        run_id, op, payload = entry["run_id"], entry["op"], entry["payload"]
        if op == "create_run" and payload.get("parent") is None:  # a run handed over
            self.ids[run_id] = _create_handed_over(self.client, run_id, payload, self.uri,
                                                   self.path.parent, self.attempts)
        elif op == "create_run":
            self.ids[run_id] = _create_run(self.client, run_id, payload)
        elif run_id.startswith(PENDING):
            raise Unsendable(f"refused by {self.store}: its run {run_id} was never created")
        elif op not in REPLAYABLE:
            raise Unsendable(f"refused by {self.store}: unknown op {op!r}")
        else:
            apply(self.client, run_id, op, payload)

    def _mapped(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry with the real ids of child runs created so far."""
        out = {**entry, "run_id": self.ids.get(entry["run_id"], entry["run_id"])}
        if entry["op"] == "create_run":
            parent = entry["payload"].get("parent")
            out["payload"] = {**entry["payload"], "parent": self.ids.get(parent, parent)}
            out["run_id"] = entry["run_id"]  # still the key the lines after it use
        return out

    def _reject(self, entry: dict[str, Any], reason: str) -> None:
        self.rejected.append({"reason": reason, "entry": entry})

    def _finish(self, kept: list[dict[str, Any]]) -> None:
        """Set the rejected lines aside; in the file, `kept` then the lines appended
        since it was read (or no file). The copies of sent artifacts go."""
        if self.rejected:
            with self.path.with_suffix(".rejected").open("a") as fh:
                fh.writelines(json.dumps(r, default=str) + "\n" for r in self.rejected)
                fh.flush()
                os.fsync(fh.fileno())
        with _locked(self.path, create=True) as fd:
            fresh = os.pread(fd, max(os.fstat(fd).st_size - self.taken, 0), self.taken)
            text = "".join(json.dumps(e, default=str) + "\n" for e in kept).encode()
            if text or fresh:
                write_bytes(self.path, text + fresh)  # a rename: waiting writers reopen
            else:
                self.path.unlink()
        # Only the folders of what was sent: a stage appending meanwhile may have copied
        # files whose line comes after this replay's last read.
        files = self.path.with_suffix(".files")
        for sent in self.sent_files:
            if sent.parent.parent.resolve() == files.resolve():
                shutil.rmtree(sent.parent, ignore_errors=True)
        with contextlib.suppress(OSError):
            files.rmdir()  # empty once nothing waits in it


def _outbox_run(client, experiment_id: str, local_id: str):
    """The run a replay created for `local_id` (a replay killed after creating it must
    not create it twice), or None."""
    found = client.search_runs([experiment_id], f"tags.`{OUTBOX_ID}` = '{local_id}'", max_results=1)
    return found[0] if found else None


def _create_handed_over(client, local_id: str, payload: dict[str, Any], uri: str,
                        folder: Path, attempts: int) -> str:
    """Open a run a stage handed over, as stage_run opens one: its id goes into the
    run file waiting for it, and its stage's runs orphaned by a kill are closed."""
    experiment_id = experiment_id_of(import_mlflow(), payload["experiment"], uri)
    run, stage = _outbox_run(client, experiment_id, local_id), payload["run_file"]["stage"]
    if run is None:
        # Owned by this process now: the stage that handed it over has exited.
        tags = {**payload["tags"], **owner_tags(), OUTBOX_ID: local_id}
        run = client.create_run(experiment_id, start_time=payload.get("start_time"), tags=tags,
                                run_name=payload.get("name"))
        close_orphans(stage, run.info.run_id, folder / "heartbeats_seen.json", attempts)
    log.info("%s: MLflow run %s: %s", stage, run.info.run_name,
             ui_url(uri, experiment_id, run.info.run_id))
    settle_run_file(payload["run_file"]["folder"], local_id, run.info.run_id)
    return run.info.run_id


def _create_run(client, local_id: str, payload: dict[str, Any]) -> str:
    """Create a child run queued while the store was away; its real id. Found by its
    local id first: a sync killed after creating it must not create it twice."""
    experiment_id = client.get_run(payload["parent"]).info.experiment_id
    if found := _outbox_run(client, experiment_id, local_id):
        return found.info.run_id
    tags = {**payload["tags"], "mlflow.parentRunId": payload["parent"], OUTBOX_ID: local_id}
    return client.create_run(experiment_id, start_time=payload.get("start_time"), tags=tags,
                             run_name=payload.get("name")).info.run_id
