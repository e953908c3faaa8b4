"""Named points where a test kills this process (SIGKILL, as `kill -9` would).

`TFMLOPS_FAULT=<point>` makes the process that reaches `<point>` kill itself
there; `<point>@<n>` waits for its n-th visit. A point marked `parent` kills
the process's parent instead (a pool worker killing `prepare` while it
decodes). `TFMLOPS_FAULT_SIGNAL=SIGSTOP` stops the process there instead
(a test holds it at a known place, then lets it go on with SIGCONT). Unset, a
point costs one environment look-up. The kill test
(tests/integration/test_prepare_kill.py) visits every name in `POINTS`.

The stage harness (harness.py) visits the same `STAGE_POINTS` in every stage, as
`<stage>.<point>` (`stage_point`): `prepare.output_locked` is prepare's, in `POINTS`;
`tune.running` is tune's (tests/integration/test_harness.py).
"""

from __future__ import annotations

import os
import signal

# harness.stage's, in every stage, in this order: the output lock taken; the run open
# (on its first use); reports/<stage>.json written.
STAGE_POINTS = ("output_locked", "running", "reported")
POINTS = (
    "prepare.output_locked", "prepare.listed", "decode.stat", "decode.first",
    "decode.worker", "cache.put", "cache.torn", "decode.done", "memo.begin",
    "memo.committed", "write.first", "write.quarantine", "write.closed", "json.temp",
    "json.manifest", "prepare.running", "swap.old", "swap.done",
    "compact.temp", "compact.replaced", "prepare.compacted", "prepare.reported",
)
_visits: dict[str, int] = {}


def armed(name: str) -> bool:
    """Whether `name` is the point this process is to be killed at."""
    return os.environ.get("TFMLOPS_FAULT", "").partition("@")[0] == name


def stage_point(stage: str, name: str) -> None:
    """`point(f"{stage}.{name}")` for one of the harness's `STAGE_POINTS` (test_prepare_kill
    reads each call in harness.py)."""
    point(f"{stage}.{name}")


def point(name: str, parent: bool = False) -> None:
    if not armed(name):
        return
    _visits[name] = _visits.get(name, 0) + 1
    if _visits[name] == int(os.environ["TFMLOPS_FAULT"].partition("@")[2] or 1):
        sig = getattr(signal, os.environ.get("TFMLOPS_FAULT_SIGNAL", "SIGKILL"))
        if sig == signal.SIGSTOP and not parent:
            _stop_here()
            return
        os.kill(os.getppid() if parent else os.getpid(), sig)
        if parent:
            os.kill(os.getpid(), sig)


def _stop_here() -> None:
    """Stop this process; once continued, handle here what was sent to it meanwhile.

    A signal sent to a stopped process (a test's Ctrl-C, then SIGCONT) waits in its shared
    pending set; once continued, any of its threads may take it, and Python runs the
    handler in the main thread at its next check, which may come after this point has
    returned (seen: prepare's Ctrl-C raised after swap-in's second rename, the new output
    kept). So this waits, up to 5 s, until a handler has run (a byte in the wakeup fd; its
    exception is raised by the next call here) or nothing has been pending for 50 ms."""
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        os.kill(os.getpid(), signal.SIGSTOP)
        deadline = quiet_since = time.monotonic()
        deadline += 5
        while time.monotonic() < deadline:
            try:
                if os.read(r, 64):
                    break  # a handler ran: the main thread raises its exception by now
            except BlockingIOError:
                pass
            if _signals_pending():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 0.05:
                break  # nothing pending for 50 ms and no handler ran: nothing was sent
            time.sleep(0.001)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)


def _signals_pending() -> bool:
    """Whether a signal waits for this process (its shared set) or one of its threads."""
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                for line in f:
                    if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16):
                        return True
        except OSError:
            continue
    return False
