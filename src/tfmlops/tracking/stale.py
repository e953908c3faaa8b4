"""Runs left RUNNING by a killed process: who owns a run, and closing the orphans.

A SIGKILL (or a power cut) gives a stage no chance to end its MLflow run, which
then shows RUNNING forever. Every run opens with owner tags (`owner_tags`: host,
boot, pid namespace, pid and the process's start time, repo). When a stage opens
its next run, `close_orphans` marks KILLED the RUNNING runs of the same stage and
repo in the same store whose owner process is provably gone: same host, same
boot and pid namespace, and that pid either no longer exists or belongs to a
process that started at another time (pid reuse). A run owned elsewhere (another
host or container) is left alone: from here its owner cannot be judged. Child
runs (trials, finalists) of a closed run are closed with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

from tfmlops.tracking.uri import repo_root

log = logging.getLogger(__name__)

OWNER = "tfmlops.owner."
KILLED_TAG = "tfmlops.killed_reason"


def owner_tags() -> dict[str, str]:
    """The tags naming this process as a run's owner."""
    pid = os.getpid()
    return {f"{OWNER}{k}": v for k, v in {
        "host": socket.gethostname(), "boot": _boot_id(), "pidns": _pid_namespace(),
        "pid": str(pid), "start": _start_time(pid), "repo": str(repo_root()),
    }.items()}


def owner_gone(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's owner tags provably no longer runs."""
    me = owner_tags()
    same_machine = all(tags.get(OWNER + k) == me[OWNER + k] for k in ("host", "boot", "pidns"))
    pid = tags.get(OWNER + "pid", "")
    if not same_machine or not pid.isdigit():
        return False
    if not _exists(int(pid)):
        return True
    started = tags.get(OWNER + "start", "")
    return bool(started) and _start_time(int(pid)) not in ("", started)  # pid reused


def close_orphans(client, experiment_id: str, stage: str, current_run_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of `stage` (this repo) whose owner is gone; their ids."""
    repo = str(repo_root())
    query = f"tags.`tfmlops.stage` = '{stage}' and attributes.status = 'RUNNING'"
    running = client.search_runs([experiment_id], query, max_results=1000)
    orphans = [r for r in running if r.info.run_id != current_run_id
               and r.data.tags.get(OWNER + "repo") == repo and owner_gone(r.data.tags)]
    closed = {r.info.run_id for r in orphans}
    # children of a closed run (a trial of a killed search) go with it
    closed |= {r.info.run_id for r in running
               if r.data.tags.get("mlflow.parentRunId") in closed and not _owned_alive(r)}
    for run_id in sorted(closed):
        client.set_tag(run_id, KILLED_TAG,
                       f"owner process gone; closed by run {current_run_id} of {stage}")
        client.set_terminated(run_id, "KILLED")
    if closed:
        log.warning("tfmlops: %s: %d run(s) left RUNNING by a killed process marked KILLED: %s",
                    stage, len(closed), ", ".join(sorted(closed)))
    return sorted(closed)


def close_orphans_of(stage: str, current_run_id: str) -> list[str]:
    """`close_orphans` for the stage whose run just opened; a failure only warns."""
    from tfmlops.tracking.retry import first_line
    from tfmlops.tracking.uri import client

    try:
        mlflow_client = client()
        experiment_id = mlflow_client.get_run(current_run_id).info.experiment_id
        return close_orphans(mlflow_client, experiment_id, stage, current_run_id)
    except Exception as exc:  # noqa: BLE001 - housekeeping must never stop a stage
        log.warning("tfmlops: %s: could not look for runs left RUNNING by killed processes: %s",
                    stage, first_line(exc))
        return []


def _owned_alive(run) -> bool:
    """A child with owner tags whose owner still runs (a distributed worker) stays open."""
    tags = run.data.tags
    return OWNER + "pid" in tags and not owner_gone(tags)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), or "" if unknown."""
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name may hold spaces
    return ""


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def _pid_namespace() -> str:
    """Containers on one host share its hostname rarely, but a pid means nothing across
    pid namespaces: a run from another namespace is never judged."""
    with contextlib.suppress(OSError):
        return str(os.stat("/proc/self/ns/pid").st_ino)
    return ""
