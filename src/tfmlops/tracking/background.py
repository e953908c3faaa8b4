"""Tracking work done beside a stage instead of in its way (issue 16: the fixed cost of
tracking is most of its overhead on a short run).

- `Background`: one call in a thread whose error `join()` raises in the caller, so
  a failure there fails the stage instead of vanishing with the thread.
- `is_store_error`: what counts as the store being away (retried, then queued in the
  outbox) as against a bug or a model that cannot be saved (raised).

No MLflow at import time: `tfmlops --help` imports this package.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """`fn()` in a daemon thread; `join()` waits and raises whatever `fn` raised."""

    def __init__(self, fn: Callable[[], Any], name: str):
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name=f"tfmlops-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def join(self) -> Any:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def is_store_error(exc: BaseException) -> bool:
    """The store refused or could not be reached (MLflow's errors, network and file
    errors): retried and queued. Anything else is a bug or a bad model: raised."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, (MlflowException, OSError))
