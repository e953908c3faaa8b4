"""Lineage: what a run was made from, recorded so the chain survives DVC's cache.

Owns the git state (commit, dirty), the data version (hash of the prepared
manifest), the lineage tags a stage's run carries (including its upstream stages'
run ids), and `mlflow_run.json`, the file each stage writes next to its outputs
naming its run. No MLflow here: only files and git.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfmlops import artifacts
from tfmlops.config import Config
from tfmlops.files import read_json, write_text
from tfmlops.tracking.stale import owner_tags
from tfmlops.tracking.uri import redact, repo_root

RUN_FILE = artifacts.RUN_FILE
PENDING_KEY = "pending"  # in a run file: the local id of the run handed over, until it is sent
# How long a reader waits for a detached run's delivery (a sidecar ends its run within
# seconds; one that hangs is killed by nobody, so the reader goes on without it).
DELIVERY_WAIT_S = 300.0
log = logging.getLogger(__name__)


def git_state(root: Path) -> tuple[str, bool]:
    """(HEAD commit, whether tracked files differ from it); ("unknown", False) without git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return commit or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def read_run_file(folder: str | Path) -> dict[str, Any]:
    """The `mlflow_run.json` in `folder` ({} if missing or unreadable), once a run handed
    over to be delivered is in the store (wait_delivered)."""
    wait_delivered(folder)
    return read_json(Path(folder) / RUN_FILE, {})


def wait_delivered(folder: str | Path, timeout_s: float = DELIVERY_WAIT_S) -> bool:
    """Wait while a detached sidecar (holding the delivery lock) delivers the run of
    `folder`'s stage, or a run is queued to be delivered after it (a stage or sidecar
    holding the queue lock); False if one still was after `timeout_s`."""
    lock = Path(folder) / artifacts.DELIVERY_LOCK
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # never detached here
        return True
    try:
        give_up, said = time.monotonic() + timeout_s, False
        while not _settled(fd, lock.with_name(artifacts.DELIVERY_QUEUE)):
            if time.monotonic() > give_up:
                log.warning("tfmlops: the MLflow run in %s is still being delivered after "
                            "%.0f s; going on without waiting (its log: %s)", folder,
                            timeout_s, lock.with_name(artifacts.DETACHED_LOG))
                return False
            if not said:
                log.info("tfmlops: waiting for the MLflow run in %s to reach the store", folder)
                said = True
            time.sleep(0.05)
        return True
    finally:
        os.close(fd)


def _settled(lock: int, queue: Path) -> bool:
    """Whether no run is being delivered (the delivery lock `lock` is free) and none waits
    for its turn (the queue lock at `queue` is free). The queue is checked while holding
    the lock: a queued sidecar takes the lock before it leaves the queue, so the moment
    between two deliveries does not look settled."""
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    try:
        return _none_queued(queue)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


def _none_queued(path: Path) -> bool:
    """Whether no run waits for its turn to be delivered (none holds the queue lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # never queued here
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go at once, as the file closes
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def write_run_file(out_dir: Path, stage: str, run_id: str | None, uri: str | None,
                   facts: dict[str, Any] | None = None) -> None:
    """Write `mlflow_run.json` atomically (a reader never sees half a file), the URI
    without its credentials: the file is a DVC output that `dvc push` uploads. A run
    handed over (outbox.py) has no id yet: its file says `pending` (its local id)."""
    data = {"stage": stage, "run_id": run_id, "tracking_uri": redact(uri) if uri else uri,
            **(facts or {})}
    with _run_file_lock(out_dir):
        write_text(out_dir / RUN_FILE, json.dumps(data, indent=2) + "\n")


def settle_run_file(out_dir: str | Path, pending: str, run_id: str) -> bool:
    """Put `run_id` into the run file still waiting for the run handed over as `pending`;
    False if a later run of the stage has written its own since (it stays)."""
    path = Path(out_dir) / RUN_FILE
    with _run_file_lock(Path(out_dir)):
        data = read_json(path, {})
        if data.get(PENDING_KEY) != pending:
            return False
        data = {**{k: v for k, v in data.items() if k != PENDING_KEY}, "run_id": run_id}
        write_text(path, json.dumps(data, indent=2) + "\n")
    return True


@contextlib.contextmanager
def _run_file_lock(folder: Path) -> Iterator[None]:
    """The run file's writers one at a time (a lock on its folder, so none is left
    behind): a stage writing a new one, a replay settling an old one."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_tags(cfg: Config, stage: str, upstream: dict[str, str | Path] | None) -> dict[str, str]:
    """The tags a stage's run opens with: its lineage, owner process and upstream runs."""
    commit, dirty = git_state(repo_root())
    tags = {
        "tfmlops.stage": stage,
        "tfmlops.params_hash": cfg.digest(),
        artifacts.TAG_DATA_VERSION: artifacts.data_version(cfg.paths.prepared),
        "mlflow.source.git.commit": commit,
        # MLflow's own guess is this process's argv[0]: `-c` in train's sidecar process.
        "mlflow.source.name": f"tfmlops {stage}",
        "mlflow.source.type": "LOCAL",
        "tfmlops.git_dirty": str(dirty).lower(),
        **owner_tags(),  # so a later run can tell this one was orphaned by a kill
    }
    if exp_name := os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = exp_name
    for name, folder in (upstream or {}).items():
        if run_id := linked_run_id(folder, tags[artifacts.TAG_DATA_VERSION]):
            tags[f"tfmlops.upstream.{name}"] = run_id
    return tags


def linked_run_id(folder: str | Path, data: str) -> str | None:
    """The run id in `folder`'s `mlflow_run.json`, unless the run made another data
    version than `data`, the one read now (prepare's last run, a `dvc checkout` since)."""
    up = read_run_file(folder)
    if up.get(artifacts.DATA_VERSION, data) != data:
        return None
    return up.get("run_id") or None


def dvc_data_hashes(cfg: Config, root: Path) -> dict[str, str]:
    """The dvc.lock hash of every data folder (image_dir, builtin, prepared)."""
    import yaml

    lock = root / "dvc.lock"
    if not lock.is_file():
        return {"lineage.dvc_lock": "none"}
    wanted = {_rel_to(root, p) for p in (cfg.data.image_dir, cfg.paths.builtin, cfg.paths.prepared)}
    found = {}
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    for stage in stages.values():
        for entry in [*stage.get("deps", []), *stage.get("outs", [])]:
            if entry.get("path") in wanted and entry.get("md5"):
                found[f"lineage.dvc.{entry['path']}"] = entry["md5"]
    return found or {"lineage.dvc_lock": "no data entries"}


def _rel_to(root: Path, path: str) -> str:
    p = Path(path)
    return str(p.relative_to(root) if p.is_absolute() and p.is_relative_to(root) else p)
