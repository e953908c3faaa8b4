"""Progress that reads well in a terminal and stays short in a CI log."""

from __future__ import annotations

import logging
import sys
import time

from tfmlops.logs import quieted

log = logging.getLogger(__name__)


class Progress:
    """A redrawn line on a TTY; otherwise an INFO message every `every` items and at the end."""

    def __init__(self, total: int | None, label: str, every: int = 500, stream=None):
        self.total, self.label, self.every = total, label, every
        self.stream = stream or sys.stderr
        # The redraw bypasses logging (a handler cannot rewrite its last line), so `-q` stops it.
        self.tty = self.stream.isatty() and not quieted()
        self.done = 0
        self.start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        before = self.done
        self.done += n
        if self.tty:
            self._redraw("")
        elif self.done // self.every > before // self.every or self.done == self.total:
            log.info("%s", self._line())

    def close(self) -> None:
        if self.tty:
            self._redraw("\n")
        elif self.done % self.every:
            log.info("%s", self._line())

    def _line(self) -> str:
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        of = f"/{self.total}" if self.total else ""
        return f"{self.label}: {self.done}{of} ({rate:,.0f}/s)"

    def _redraw(self, tail: str) -> None:
        self.stream.write(f"\r{self._line()}{tail}")
        self.stream.flush()


def keras_verbose() -> int:
    """Keras progress bars in a terminal, one line per epoch in a log, none under `-q`."""
    if quieted():
        return 0
    return 1 if sys.stdout.isatty() else 2
