"""The one retry loop of the project: bounded exponential backoff around a store call.

Used by the tracking runs (a call that stays failed goes to the outbox) and by the
model registry (a call that stays failed raises TrackingUnavailable). MLflow's own
HTTP retries cannot replace it: they cover only REST stores (not the SQLite store's
"database is locked"), they know nothing of the outbox, and by default they back off
for minutes. `uri.import_mlflow` bounds them to one retry so this loop decides.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from typing import TypeVar

from tfmlops.tracking.uri import redact

T = TypeVar("T")


class RetriesExhausted(Exception):
    """Every attempt failed; `last` is the final error."""

    def __init__(self, attempts: int, last: Exception):
        super().__init__(f"failed after {attempts} attempts: {first_line(last)}")
        self.attempts = attempts
        self.last = last


def call_with_retry(fn: Callable[[], T], attempts: int, *, final_codes: Collection[str] = (),
                    jitter: bool = False, before: Callable[[], None] | None = None,
                    budget_s: float | None = None) -> T:
    """`fn()`, tried up to `attempts` times with `backoff_s` between tries.

    An error whose MLflow `error_code` is in `final_codes` (the store answered and
    refused: trying again would be refused too) is raised at once. After the last
    failed attempt, RetriesExhausted is raised. `jitter` spreads the sleeps of
    processes that failed together (competing promotions), so they do not retry in step.
    `before()` runs ahead of every attempt (it raises to stop them: a lost lock); with
    `budget_s`, no attempt starts later than that after the first one did.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    last: Exception | None = None
    deadline = None if budget_s is None else time.monotonic() + budget_s
    for attempt in range(attempts):
        if before is not None:
            before()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified here, raised below
            if error_code(exc) in final_codes:
                raise
            last = exc
            if attempt + 1 < attempts:
                pause = backoff_s(attempt) * ((0.5 + random.random()) if jitter else 1)
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise RetriesExhausted(attempt + 1, last) from None
                time.sleep(pause)
    raise RetriesExhausted(attempts, last)


def backoff_s(attempt: int) -> float:
    """0.5, 1, 2, 4, 8, 8, ... seconds: bounded, so an outage costs a known time."""
    return min(0.5 * 2**attempt, 8.0)


def retry_window_s(attempts: int, attempt_s: float) -> float:
    """The longest `call_with_retry(fn, attempts)` can take when one attempt takes at most
    `attempt_s`: every attempt at its bound, plus the sleeps between them."""
    return attempts * attempt_s + sum(backoff_s(i) for i in range(attempts - 1))


def error_code(exc: BaseException) -> str | None:
    """The MLflow error code (`RESOURCE_DOES_NOT_EXIST`...) of an MlflowException, else None."""
    return getattr(exc, "error_code", None)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an error's message (MLflow's can run to pages), cut to `limit`,
    without credentials (MLflow's REST errors quote the URL they called)."""
    return redact((str(exc).splitlines() or [type(exc).__name__])[0])[:limit]
