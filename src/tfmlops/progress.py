"""Progress of long loops as log lines: done, rate, time left, every few seconds."""

from __future__ import annotations

import logging
import sys
import time

from tfmlops.logs import quieted

log = logging.getLogger(__name__)


class Progress:
    """One INFO line every `seconds` (and one at the end): items done of the total,
    items/s since the start and, when the total is known, an estimated time left."""

    def __init__(self, total: int | None, label: str, seconds: float = 5.0, clock=time.perf_counter):
        self.total, self.label, self.seconds, self.clock = total, label, seconds, clock
        self.done = 0
        self.start = self.last = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.seconds:
            self.last = now
            log.info(self.line(now))

    def close(self) -> None:
        log.info(self.line(self.clock(), final=True))

    def line(self, now: float, final: bool = False) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        of = f"/{self.total}" if self.total else ""
        text = f"{self.label}: {self.done}{of} ({rate:,.1f}/s"
        if final:
            return f"{text}, {elapsed:.1f} s)"
        if self.total and rate > 0:
            text += f", {_duration((self.total - self.done) / rate)} left"
        return text + ")"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def keras_verbose() -> int:
    """Keras progress bars in a terminal, one line per epoch in a log, none under `-q`."""
    if quieted():
        return 0
    return 1 if sys.stdout.isatty() else 2
