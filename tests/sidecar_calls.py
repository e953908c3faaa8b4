"""Functions a test hands to `StageRun.perform`: the tracking sidecar imports them by
name, so they live in a module of their own (tests/ is on its PYTHONPATH)."""

import os

from tfmlops.errors import DataError


def where(run, value):
    """Where it ran, with which run; DataError for "bad"."""
    if value == "bad":
        raise DataError("bad value; fix it")
    return {"pid": os.getpid(), "run_id": run.run_id, "value": value}
