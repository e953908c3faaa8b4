"""The runs of one stage in the order they started: what `tfmlops history` reads.

Every alias move (promote, rollback, forced, refused) is a `promote` run whose tags
hold its decision (`stages/promote.py`), so the registry's history is a query of
those runs, oldest first; `mlflow.user` says who ran it.
"""

from __future__ import annotations

from tfmlops.artifacts import TAG_STAGE
from tfmlops.tracking.naming import equals
from tfmlops.tracking.stale import all_runs
from tfmlops.tracking.uri import ensure_reachable, tracking_uri, use_uri


def stage_runs(cfg, stage: str, params: dict[str, str] | None = None) -> list[dict]:
    """Every run of `stage` in the experiment (with these `params`), oldest first: its id,
    status, start time (ms since the epoch) and tags."""
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    client = use_uri(uri).MlflowClient()
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    if experiment is None:
        return []
    query = " and ".join([equals(f"tags.`{TAG_STAGE}`", stage),
                          *(equals(f"params.`{k}`", v) for k, v in (params or {}).items())])
    return [{"run_id": r.info.run_id, "status": r.info.status, "start_time": r.info.start_time,
             "tags": dict(r.data.tags)} for r in all_runs(client, experiment.experiment_id, query)]
