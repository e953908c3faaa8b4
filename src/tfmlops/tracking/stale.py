"""Runs left RUNNING by a killed process: who owns a run, and closing the orphans.

A SIGKILL (or a power cut) gives a stage no chance to end its MLflow run. Every run
opens with owner tags (`owner_tags`: host, boot, pid namespace, pid and start time,
repo). When a stage opens its next run, `close_orphans` marks KILLED the RUNNING runs
of the same stage and repo whose owner is gone:
- owned on this machine (same host, boot and pid namespace): that pid no longer
  exists or belongs to a process that started at another time (pid reuse);
- owned elsewhere: its heartbeat (heartbeat.py) has not moved for longer than
  `stale_after_s`, as this machine saw it. A run without a heartbeat is left alone.
Child runs of a closed run are closed with it, unless another live process of this
machine owns them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

from tfmlops.files import boot_id, pid_alive, pid_namespace
from tfmlops.tracking.heartbeat import HEARTBEAT_TAG, silent_runs, stale_after_s
from tfmlops.tracking.retry import first_line
from tfmlops.tracking.uri import client, repo_root

log = logging.getLogger(__name__)

OWNER = "tfmlops.owner."
KILLED_TAG = "tfmlops.killed_reason"
SEARCH_PAGE = 1000  # runs per search call (the store's own maximum is larger)


def owner_tags() -> dict[str, str]:
    pid = os.getpid()
    return {f"{OWNER}{k}": v for k, v in {
        "host": socket.gethostname(), "boot": boot_id(), "pidns": pid_namespace(),
        "pid": str(pid), "start": _start_time(pid), "repo": str(repo_root()),
    }.items()}


def owner_gone(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's owner tags provably no longer runs."""
    pid = tags.get(OWNER + "pid", "")
    if not judged_here(tags) or not pid.isdigit():
        return False
    if not pid_alive(int(pid)):
        return True
    started = tags.get(OWNER + "start", "")
    return bool(started) and _start_time(int(pid)) not in ("", started)  # pid reused


def judged_here(tags: dict[str, str]) -> bool:
    """Whether the owner named by these tags runs on this machine (host, boot, pid
    namespace): only then can its process be looked up."""
    me = owner_tags()
    return all(tags.get(OWNER + k) == me[OWNER + k] for k in ("host", "boot", "pidns"))


def close_orphans(stage: str, current_run_id: str, sightings: Path, attempts: int) -> None:
    """Mark KILLED the RUNNING runs of `stage` (this repo) whose owner is gone, now that
    its run `current_run_id` has opened; a failure only warns. `sightings`: see
    heartbeat.silent_runs; `attempts`: how many tries their owners give each call."""
    try:
        mlflow_client = client()
        experiment_id = mlflow_client.get_run(current_run_id).info.experiment_id
        repo = str(repo_root())
        query = f"tags.`tfmlops.stage` = '{stage}' and attributes.status = 'RUNNING'"
        running = all_runs(mlflow_client, experiment_id, query)
        ours = [r for r in running if r.info.run_id != current_run_id
                and r.data.tags.get(OWNER + "repo") == repo]
        reasons = {r.info.run_id: "owner process gone" for r in ours if owner_gone(r.data.tags)}
        beats = {r.info.run_id: r.data.tags[HEARTBEAT_TAG] for r in ours
                 if HEARTBEAT_TAG in r.data.tags and not judged_here(r.data.tags)}
        if beats:
            threshold = stale_after_s(attempts)
            for run_id in silent_runs(sightings, boot_id(), beats, threshold):
                reasons[run_id] = f"heartbeat unchanged for over {threshold:.0f} s"
        owners = {r.info.run_id: _owner(r.data.tags) for r in ours if r.info.run_id in reasons}
        # children of a closed run (a trial of a killed search) go with it
        for r in running:
            parent = r.data.tags.get("mlflow.parentRunId")
            if parent in owners and r.info.run_id not in reasons and _goes_with(r, owners[parent]):
                reasons[r.info.run_id] = reasons[parent]
        for run_id in sorted(reasons):
            mlflow_client.set_tag(run_id, KILLED_TAG,
                                  f"{reasons[run_id]}; closed by run {current_run_id} of {stage}")
            mlflow_client.set_terminated(run_id, "KILLED")
    except Exception as exc:  # noqa: BLE001 - housekeeping must never stop a stage
        log.warning("tfmlops: %s: could not look for runs left RUNNING by killed processes: %s",
                    stage, first_line(exc))
        return
    if reasons:
        log.warning("tfmlops: %s: %d run(s) left RUNNING by a killed process marked KILLED: %s",
                    stage, len(reasons), ", ".join(sorted(reasons)))


def all_runs(mlflow_client, experiment_id: str, query: str) -> list:
    """Every run matching `query`, oldest first, page by page: a store that many killed
    workers left runs in holds more than one page."""
    runs, token = [], None
    while True:
        page = mlflow_client.search_runs([experiment_id], query, max_results=SEARCH_PAGE,
                                         order_by=["attributes.start_time ASC"], page_token=token)
        runs += page
        token = page.token
        if not token:
            return runs


def _owner(tags: dict[str, str]) -> tuple[str, ...]:
    return tuple(tags.get(OWNER + k, "") for k in ("host", "boot", "pidns", "pid", "start"))


def _goes_with(child, parent_owner: tuple[str, ...]) -> bool:
    """A child of a closed run is closed too, unless it has an owner of its own that
    may live: a distributed worker of this machine that still runs, or one elsewhere
    (a trial of a remote worker has no heartbeat to judge it by)."""
    tags = child.data.tags
    if OWNER + "pid" not in tags or _owner(tags) == parent_owner:
        return True
    return judged_here(tags) and owner_gone(tags)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), or "" if unknown."""
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name may hold spaces
    return ""
