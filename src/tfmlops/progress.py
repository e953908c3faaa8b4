"""Progress that reads well in a terminal and stays short in a CI log."""

from __future__ import annotations

import sys
import time


class Progress:
    """A redrawn line on a TTY; otherwise one line every `every` items and at the end."""

    def __init__(self, total: int | None, label: str, every: int = 500, stream=None):
        self.total, self.label, self.every = total, label, every
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        before = self.done
        self.done += n
        if self.tty:
            self._write("\r", "")
        elif self.done // self.every > before // self.every or self.done == self.total:
            self._write("", "\n")

    def close(self) -> None:
        if self.tty or self.done % self.every:
            self._write("\r" if self.tty else "", "\n")

    def _write(self, head: str, tail: str) -> None:
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        of = f"/{self.total}" if self.total else ""
        self.stream.write(f"{head}{self.label}: {self.done}{of} ({rate:,.0f}/s){tail}")
        self.stream.flush()


def keras_verbose() -> int:
    """Keras progress bars in a terminal, one line per epoch in a log."""
    return 1 if sys.stdout.isatty() else 2
