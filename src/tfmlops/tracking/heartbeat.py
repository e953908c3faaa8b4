"""Whether a run owned on another machine is still kept: its heartbeat.

An owner process on another host or container cannot be looked up (stale.py), so each
stage's run carries a heartbeat tag (`HEARTBEAT_TAG`), a counter its owner renews every
`HEARTBEAT_S` seconds from a daemon thread (`Heartbeat`).

A counter, not a time: two machines' clocks must never be compared, and MLflow 3
stamps nothing a run's owner can renew cheaply with the store's own time (tags carry
no time; metric and run times are the client's; the times the store stamps belong to
experiments and models users see). So the closer keeps what it saw of each counter,
and when, by its own boot-time clock, in a small local file (`silent_runs`), and
calls a run dead only when the counter did not change for longer than the threshold.
The cost: a run is closed by the first run of its stage that opens longer than the
threshold after one that saw the counter, not by the first one after the owner died.

The threshold is above the store's retry window (retry.py, uri.attempt_bound_s): a
live owner that cannot reach the store keeps trying that long before its next beat.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from tfmlops.files import hold_lock, write_json
from tfmlops.tracking.ops import REFUSED
from tfmlops.tracking.retry import call_with_retry, first_line, retry_window_s
from tfmlops.tracking.uri import attempt_bound_s, client

log = logging.getLogger(__name__)

HEARTBEAT_TAG = "tfmlops.heartbeat"
HEARTBEAT_S = 30.0  # how often a run's owner renews its heartbeat
# Overrides, so tests judge heartbeats in seconds rather than minutes.
HEARTBEAT_ENV = "TFMLOPS_HEARTBEAT_S"
STALE_AFTER_ENV = "TFMLOPS_STALE_AFTER_S"


def heartbeat_s() -> float:
    return float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_S)


def stale_after_s(attempts: int) -> float:
    """How long a heartbeat must stand still before its run is taken for dead. Between
    two beats that reach the store lie at most one interval and one retried call
    (`attempts` tries, each at its bound): twice that, so one slow beat and clock
    jitter never close a live run."""
    if override := os.environ.get(STALE_AFTER_ENV):
        return float(override)
    return 2 * (heartbeat_s() + retry_window_s(attempts, attempt_bound_s()))


class Heartbeat:
    """Renews `HEARTBEAT_TAG` of one run every `interval` s until `stop()`. A beat goes
    through the retry loop in this daemon thread: it never blocks nor fails the stage,
    and one that fails is only logged (the next one tries again)."""

    def __init__(self, run_id: str, attempts: int, interval: float | None = None):
        self.run_id, self.attempts = run_id, attempts
        self.interval = heartbeat_s() if interval is None else interval
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfmlops-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating; returns at once (a beat in its retries gives up before its next try)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beats += 1
            try:
                call_with_retry(lambda: client().set_tag(self.run_id, HEARTBEAT_TAG,
                                                         str(self.beats)),
                                self.attempts, final_codes=REFUSED, before=self._stopped)
            except _Stopped:
                return
            except Exception as exc:  # noqa: BLE001 - a missed beat; the stage goes on
                log.debug("heartbeat of run %s missed: %s", self.run_id, first_line(exc))

    def _stopped(self) -> None:
        if self._stop.is_set():
            raise _Stopped


class _Stopped(Exception):
    """The run ended while a beat was being retried."""


def silent_runs(sightings: Path, boot: str, beats: dict[str, str], threshold_s: float) -> list[str]:
    """The runs of `beats` (run id -> counter now) whose counter has not changed for
    longer than `threshold_s`, by what this machine saw of them, and when (its own clock).

    `sightings`, one JSON file: `{"boot": <boot id>, "runs": {run id: [counter, seen at]}}`,
    where "seen at" is when the counter was first seen at that value; it records what was
    seen now and forgets runs not in `beats`. Closers of one repo take its lock in turn.
    """
    with hold_lock(sightings.with_name(sightings.name + ".lock"),
                   f"waiting for another stage reading {sightings}"):
        seen = {}
        with contextlib.suppress(OSError, ValueError, AttributeError):
            data = json.loads(sightings.read_text())
            if data.get("boot") == boot:  # a reboot restarts the clock
                seen = {k: v for k, v in data.get("runs", {}).items()
                        if isinstance(v, list) and len(v) == 2}
        now = _clock()
        kept, silent = {}, []
        for run_id, beat in beats.items():
            before = seen.get(run_id)
            if before is None or before[0] != beat:
                kept[run_id] = [beat, now]  # new or moved: its silence starts now
                continue
            kept[run_id] = before
            if now - before[1] > threshold_s:
                silent.append(run_id)
        write_json(sightings, {"boot": boot, "runs": kept})
    return sorted(silent)


def _clock() -> float:
    """Seconds since boot, suspend included (the remote owner did not sleep with us)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
