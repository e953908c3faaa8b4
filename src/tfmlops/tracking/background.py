"""Tracking work done beside a stage instead of in its way (issue 16: the fixed cost of
tracking is most of its overhead on a short run).

- `warm_up(cfg)`: import MLflow, open the store and find the experiment in a thread
  while TensorFlow builds the dataset; `stage_run` joins it before it opens the run.
- `Background`: one call in a thread whose error `join()` raises in the caller, so
  a failure there fails the stage instead of vanishing with the thread.
- `is_store_error`: what counts as the store being away (retried, then queued in the
  outbox) as against a bug or a model that cannot be saved (raised).

No MLflow at import time: `tfmlops --help` imports this package.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


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

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def is_store_error(exc: BaseException) -> bool:
    """The store refused or could not be reached (MLflow's errors, network and file
    errors): retried and queued. Anything else is a bug or a bad model: raised."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, (MlflowException, OSError))


# ------------------------------------------------------------------ warm-up

_warm: dict[str, Any] = {"job": None, "key": None}


def warm_up(cfg) -> None:
    """Start importing MLflow, opening the store and finding the experiment in a thread.

    Only when this process will record (tracking on, chief). A failure is not raised
    here: `stage_run` does the same work again in its own thread and raises there.
    """
    from tfmlops.tracking.uri import is_chief, tracking_uri

    if not cfg.tracking.enabled or not is_chief() or _warm["job"] is not None:
        return
    uri = tracking_uri(cfg)
    key = (uri, cfg.tracking.experiment)

    def work() -> str:
        from tfmlops.tracking.naming import experiment_id_of
        from tfmlops.tracking.uri import ensure_reachable, use_uri

        ensure_reachable(uri, cfg.tracking.connect_timeout_s)
        return experiment_id_of(use_uri(uri), cfg.tracking.experiment, uri)

    _warm.update(job=Background(work, "tracking-warm-up"), key=key)


def warmed_experiment(uri: str, name: str) -> str | None:
    """The experiment id the warm-up found for (`uri`, `name`), once it is done; else None.

    Joins the warm-up: MLflow's first import must not race a second one in this thread.
    """
    job, key = _warm["job"], _warm["key"]
    if job is None:
        return None
    _warm.update(job=None, key=None)
    try:
        experiment_id = job.join()
    except BaseException as exc:  # noqa: BLE001 - the caller redoes the work and raises
        log.debug("tracking warm-up failed (%s); opening the run the slow way", exc)
        return None
    return experiment_id if key == (uri, name) else None
