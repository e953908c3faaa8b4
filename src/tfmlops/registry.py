"""The MLflow model registry: register exported versions, read them, move aliases safely.

With the tracking package, the only code that calls MLflow. Aliases, never the deprecated
stages: `production`, `previous` (what production replaced, the rollback target),
`candidate` (refused by the gate), `inconclusive` (the gate could not show it is not worse),
`awaiting-approval` (passed, waiting for `tfmlops approve`) and `exp-<name>` (a version a
DVC experiment produced). The promotion ledger (stages/promote/ledger.py, the model's tags) is
the record of every decision; the aliases are its cache.

Registration is idempotent: `register` looks for the version tagged with its key
(`tfmlops.register_key`) before creating one, inside the retried call: a timeout
after the server committed finds the version instead of creating a second one.

Moving an alias is a last-writer-wins upsert, so promotions hold a lock: a registered
model named `<model>.promotion-lock`, created atomically (the store's unique name
constraint: a second creator gets RESOURCE_ALREADY_EXISTS).
- The holder renews it from a heartbeat thread (an update of the lock's description
  every lease/4), so the server stamps its last_updated_timestamp.
- A waiter never compares clocks: it breaks the lock only after the lock's (holder,
  server timestamp, description) stayed unchanged for the holder's lease, measured on
  the waiter's own monotonic clock. A live holder, however slow, on whichever host or
  container, renews and is never broken.
- Breaking (and releasing) renames the lock to a unique name: the store lets exactly one
  rename of a name succeed, so only one breaker wins; the winner checks it took the lock
  it judged dead, and puts back one it did not.

Calls are retried by the tracking package's one retry helper (bounded backoff, with
jitter here so competing promotions do not retry in step); a registry that stays away
raises TrackingUnavailable (a promotion is never queued for later).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.errors import DataError, TrackingUnavailable
from tfmlops.tracking.naming import equals
from tfmlops.tracking.retry import RetriesExhausted, call_with_retry, error_code, first_line
from tfmlops.tracking.uri import attempt_bound_s

log = logging.getLogger(__name__)

PRODUCTION, PREVIOUS, CANDIDATE = "production", "previous", "candidate"
INCONCLUSIVE, AWAITING = "inconclusive", "awaiting-approval"
LOCK_SUFFIX = ".promotion-lock"
LOCK_WAIT_S = 300.0
LOCK_WAIT_MARGIN_S = 30.0  # beyond the holder's lease: time to see it unrenewed and break it
LOCK_HOLDER, LOCK_LEASE = "tfmlops.lock.holder", "tfmlops.lock.lease_s"
REGISTER_KEY = "tfmlops.register_key"
DESCRIPTION_LIMIT = 4900  # the SQL store keeps 5,000 characters of a version description

_PERMANENT = {"RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE"}


class Registry:
    """One registered model in the configured store."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.name = cfg.promote.registered_model
        self.uri = tracking.tracking_uri(cfg)
        tracking.ensure_reachable(self.uri, cfg.tracking.connect_timeout_s)
        self.client = tracking.use_uri(self.uri).MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self._lease: _Lease | None = None  # set while this object holds the promotion lock

    def alias(self, alias: str) -> str | None:
        return self.aliases().get(alias)

    def aliases(self) -> dict[str, str]:
        try:
            model = self._call(lambda c: c.get_registered_model(self.name), "read the model")
        except _Missing:
            return {}
        return {a: str(v) for a, v in (model.aliases or {}).items()}

    def model_tags(self) -> dict[str, str]:
        """The registered model's own tags ({} when the model does not exist yet)."""
        try:
            model = self._call(lambda c: c.get_registered_model(self.name), "read the model")
        except _Missing:
            return {}
        return dict(model.tags or {})

    def set_model_tag(self, key: str, value: str) -> None:
        """A tag of the registered model (the ledger writes only about a model that exists:
        one of its versions or its alias is what an entry decides about)."""
        self._write(lambda c: c.set_registered_model_tag(self.name, key, value), f"tag {self.name}")

    def tags(self, version: str) -> dict[str, str]:
        try:
            return dict(self._version(version).tags or {})
        except _Missing:
            raise DataError(f"version {version} of registered model {self.name} does not exist; "
                            f"see the versions with `mlflow models` or the MLflow UI") from None

    def source(self, version: str) -> str:
        """The model URI version `version` was registered from."""
        return self._version(version).source

    def exists(self, version: str) -> bool:
        try:
            self._version(version)
        except _Missing:
            return False
        return True

    def _version(self, version: str):
        return self._call(lambda c: c.get_model_version(self.name, str(version)), f"read version {version}")

    def download_version(self, version: str, dest: Path) -> Path:
        """Version `version`'s model folder (MLmodel and its artifacts) downloaded into `dest`."""
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file
        mlflow = tracking.import_mlflow()
        uri = self._call(lambda c: c.get_model_version_download_uri(self.name, str(version)),
                         f"locate version {version}")
        return Path(self._call(lambda c: mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=str(dest), tracking_uri=self.uri), f"download version {version}"))

    def run_artifact(self, run_id: str, path: str, dest: Path) -> Path | None:
        """The artifact `path` of run `run_id` downloaded into `dest`; None when the run
        or the file is not in the store (deleted, or logged to another store)."""
        try:
            return Path(self._call(lambda c: c.download_artifacts(run_id, path, str(dest)),
                                   f"download {path} of run {run_id}"))
        except (_Missing, OSError):
            return None

    def run_record(self, run_id: str) -> dict | None:
        """Run `run_id`'s name, params, metrics (their last values) and tags; None when
        the store has no such run (deleted, logged to another store, not a run id)."""
        try:
            run = self._call(lambda c: c.get_run(run_id), f"read run {run_id}")
        except _Missing:
            return None
        except Exception as exc:  # noqa: BLE001 - the store refused the id itself ('../x')
            if error_code(exc) == "INVALID_PARAMETER_VALUE":
                return None
            raise
        return {"run_id": run_id, "name": run.info.run_name, "params": dict(run.data.params),
                "metrics": dict(run.data.metrics), "tags": dict(run.data.tags)}

    def set_alias(self, alias: str, version: str) -> None:
        self._write(lambda c: c.set_registered_model_alias(self.name, alias, str(version)), f"set @{alias}")

    def delete_alias(self, alias: str) -> None:
        with contextlib.suppress(_Missing):
            self._write(lambda c: c.delete_registered_model_alias(self.name, alias), f"delete @{alias}")

    def tag_version(self, version: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self._write(lambda c, k=key, v=value: c.set_model_version_tag(
                self.name, str(version), k, str(v)), f"tag version {version}")

    def register(self, model_uri: str, tags: dict[str, Any], description: str, key: str | None = None) -> str:
        """The version registered under `key`, created if there is none; returns its number.
        Without a `key`, each call registers its own version (the key is unique to the call)."""
        if len(description) > DESCRIPTION_LIMIT:
            description = description[:DESCRIPTION_LIMIT] + "\n\n(truncated: see model_card.md)"
        key = key or uuid.uuid4().hex
        tags = {**{k: str(v) for k, v in tags.items()}, REGISTER_KEY: key}

        def find_or_create(client):
            found = client.search_model_versions(
                f"{equals('name', self.name)} and {equals(f'tags.`{REGISTER_KEY}`', key)}")
            if found:  # the oldest version tagged with `key`
                return str(min(int(v.version) for v in found))
            with contextlib.suppress(Exception):  # exists already: fine
                client.create_registered_model(self.name)
            return str(client.create_model_version(self.name, model_uri, tags=tags,
                                                   description=description).version)

        return self._call(find_or_create, "register a version")

    @contextlib.contextmanager
    def promotion_lock(self, wait_s: float = LOCK_WAIT_S) -> Iterator[Callable[[], None]]:
        """Hold the model's promotion lock; yields `check()`, which raises if it was lost."""
        lock = self.name + LOCK_SUFFIX
        me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        lease_s = float(self.cfg.promote.lock_lease_s)
        self._acquire(lock, me, lease_s, wait_s)
        self._lease = lease = _Lease(self, lock, me, lease_s)
        try:
            yield lease.check
        finally:
            self._lease = None
            lease.stop()
            state = None if lease.lost else self._lock_state(lock)
            if state is not None and state["holder"] == me:  # a lost lock is someone else's now
                with contextlib.suppress(_Missing):
                    self._take_away(lock, me, "release")

    def _acquire(self, lock: str, me: str, lease_s: float, wait_s: float) -> None:
        started = time.monotonic()
        tags = {LOCK_HOLDER: me, LOCK_LEASE: f"{lease_s:g}"}
        watched: tuple | None = None  # (token, monotonic time it was first seen)
        waited = False
        # Every path of the loop passes the deadline and a jittered pause: a store that
        # keeps answering "does not exist" to the create (the SQL store's clash path)
        # or keeps losing the lock between our create and our read cannot spin it.
        while True:
            try:
                self._call(lambda c: c.create_registered_model(
                    lock, tags=tags, description=f"promotion of {self.name} in progress "
                    f"(tfmlops; held by {me})"), "take the promotion lock")
                return
            except _Exists:
                seen = self._lock_state(lock)
            except _Missing:  # the SQL store reads the clashing lock, which was just released
                seen = None
            if seen is not None and seen["holder"] == me:
                return  # our create committed, then its answer was lost and retried
            now = time.monotonic()
            if seen is not None:
                if watched is None or watched[0] != seen["token"]:
                    watched = (seen["token"], now)  # renewed (or a new holder): the lease restarts
                elif now - watched[1] > seen["lease_s"]:
                    log.warning("promote: breaking the promotion lock of %s: %s did not renew it "
                                "for %.0f s", self.name, seen["holder"], now - watched[1])
                    with contextlib.suppress(_Missing):
                        self._take_away(lock, seen["holder"], "break")
                    watched = None
            # The wait outlasts a holder's lease: a dead lock is always broken first.
            if now - started > (max(wait_s, seen["lease_s"] + LOCK_WAIT_MARGIN_S) if seen else wait_s):
                holder = seen["holder"] if seen else "a holder that releases and retakes it"
                raise DataError(
                    f"another promotion of {self.name} holds the lock ({holder}) after "
                    f"{now - started:.0f} s of waiting; it is still renewing it, so it is alive")
            if seen is not None and not waited:
                log.info("promote: waiting for another promotion of %s to finish", self.name)
                waited = True
            # Shorter when the lock just went (released or broken): the next create may win.
            time.sleep((0.2 if seen is not None and watched is not None else 0.02)
                       + random.random() * 0.3)

    def _lock_state(self, lock: str) -> dict | None:
        """{holder, lease_s, token}: token changes whenever the holder renews."""
        try:
            model = self._call(lambda c: c.get_registered_model(lock), "read the lock")
        except _Missing:
            return None
        tags = dict(model.tags or {})
        try:
            lease_s = float(tags.get(LOCK_LEASE, ""))
        except ValueError:
            lease_s = float(self.cfg.promote.lock_lease_s)
        holder = tags.get(LOCK_HOLDER, "unknown")
        return {"holder": holder, "lease_s": lease_s,
                "token": (holder, model.last_updated_timestamp, model.description)}

    def _take_away(self, lock: str, holder: str, why: str) -> None:
        """Rename the lock aside, then delete it if it was `holder`'s, else put it back."""
        aside = f"{lock}.{why}-{uuid.uuid4().hex}"
        self._call(lambda c: c.rename_registered_model(lock, aside), f"{why} the lock")
        taken = self._call(lambda c: c.get_registered_model(aside), "read the lock")
        if (taken.tags or {}).get(LOCK_HOLDER) == holder:
            self._call(lambda c: c.delete_registered_model(aside), f"{why} the lock")
            return
        try:
            self._call(lambda c: c.rename_registered_model(aside, lock), "restore a lock")
        except _Exists:  # a third promotion took the name: the one we moved has lost it
            self._call(lambda c: c.delete_registered_model(aside), "drop a lock")

    def _write(self, fn, what: str):
        lease = self._lease
        if lease is None:
            return self._call(fn, what)
        # Under the lock: ownership checked before every attempt, and the retries of one
        # write end within half the lease, so no attempt starts when a waiter may break it.
        return self._call(fn, what, before=lease.check, budget_s=lease.lease_s / 2)

    def expect_aliases(self, expected: dict[str, str | None]) -> None:
        """Read the aliases again after a promotion's writes: DataError naming each one
        that is not what this promotion left (another writer moved it meanwhile)."""
        now = self.aliases()
        wrong = [f"@{a} is {now.get(a) or 'unset'}, this promotion left {'version ' + v if v else 'it unset'}"
                 for a, v in expected.items() if now.get(a) != v]
        if wrong:
            raise DataError(f"conflict on {self.name}: {'; '.join(wrong)}: another writer "
                            "moved the aliases during this promotion (outside the promotion "
                            "lock); check them in the MLflow UI, then promote again")

    def _call(self, fn, what: str, before=None, budget_s: float | None = None):
        attempts = self.cfg.tracking.retries + 1
        try:
            return call_with_retry(lambda: fn(self.client), attempts, final_codes=_PERMANENT,
                                   jitter=True, before=before, budget_s=budget_s)
        except RetriesExhausted as exc:
            raise TrackingUnavailable(
                f"model registry at {tracking.redact(self.uri)} failed to {what} after {attempts} attempts "
                f"({first_line(exc.last, 160)}); check the store, then run again") from None
        except Exception as exc:  # noqa: BLE001 - a final code: the store answered
            code = error_code(exc)
            mapped = {"RESOURCE_DOES_NOT_EXIST": _Missing, "RESOURCE_ALREADY_EXISTS": _Exists}.get(code)
            if mapped is None:
                raise
            raise mapped(str(exc)) from None


class _Missing(Exception):
    pass


class _Exists(Exception):
    pass


class _Lease:
    """A held promotion lock, renewed every lease/4 by a daemon thread until `stop()`."""

    def __init__(self, registry: Registry, lock: str, me: str, lease_s: float):
        self.registry, self.lock, self.me, self.lease_s = registry, lock, me, lease_s
        self.renewed = time.monotonic()
        self.lost: str | None = None
        self._stop = threading.Event()
        self._beats = 0
        self._thread = threading.Thread(target=self._run, name="tfmlops-lock-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - a missed beat; `check` judges the age
                log.warning("promote: could not renew the promotion lock: %s", first_line(exc))

    def renew(self) -> None:
        state = self.registry._lock_state(self.lock)
        if state is None or state["holder"] != self.me:
            self.lost = f"the lock is now held by {state['holder'] if state else 'nobody'}"
            self._stop.set()
            return
        self._beats += 1
        description = f"promotion of {self.registry.name} in progress (tfmlops; held by " \
                      f"{self.me}; renewal {self._beats})"
        asked = time.monotonic()  # before the store commits: a waiter's clock starts later
        self.registry._call(lambda c: c.update_registered_model(self.lock, description), "renew the lock")
        self.renewed = asked

    @property
    def margin_s(self) -> float:
        """How much of the lease a write must still have left when it starts.

        A waiter breaks the lock `lease_s` after the last renewal at the earliest; a write
        attempt that starts by `lease_s - margin_s` ends before that unless one store call
        takes longer than the margin (an HTTP store's is bounded by `attempt_bound_s`,
        capped at half the lease) or the process is paused (SIGSTOP, VM migration) between
        the check and the write. Such a late write is not prevented (MLflow has no
        conditional write) but detected: the ledger then disagrees with @production, and
        the next promotion records it as moved from outside and holds."""
        remote = self.registry.uri.startswith(("http://", "https://"))
        return min(max(attempt_bound_s() if remote else 0.0, self.lease_s / 4), self.lease_s / 2)

    def check(self) -> None:
        """Raise unless this process still holds the lock with `margin_s` of its lease left
        (ownership read from the store now)."""
        age = time.monotonic() - self.renewed
        if self.lost is None and age > self.lease_s - self.margin_s:
            self.lost = f"not renewed for {age:.1f} s of a {self.lease_s:g} s lease"
        if self.lost is None:
            state = self.registry._lock_state(self.lock)
            if state is None or state["holder"] != self.me:
                self.lost = f"the lock is now held by {state['holder'] if state else 'nobody'}"
        if self.lost:
            raise DataError(f"lost the promotion lock of {self.registry.name} ({self.lost}); "
                            "stopped before the next registry write: run the promotion again")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.lease_s)


def content_digest(path: Path) -> str:
    """sha256 (first 16 hex digits) of a file, or of a folder's files in path order."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        h.update(str(file.relative_to(path.parent)).encode())
        with open(file, "rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]
