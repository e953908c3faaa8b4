"""Every MLflow call of the project goes through this package.

A stage says what to record; the package knows where (uri.py), the run (run.py, or
sidecar.py: kept by a separate process), lineage (lineage.py), and what to do when the
store goes away: retry (retry.py), then queue the call (ops.py) in an outbox
(outbox.py) that `tfmlops sync` replays. A logging failure never destroys a stage's
outputs. Runs a SIGKILL left RUNNING are closed by the next run of their stage
(stale.py, heartbeat.py).

This file only re-exports the names callers use. Importing it imports no MLflow:
`tfmlops --help` must not pay for it.
"""

from tfmlops.errors import TrackingUnavailable
from tfmlops.tracking.lineage import (
    RUN_FILE,
    dvc_data_hashes,
    git_state,
    linked_run_id,
    read_run_file,
)
from tfmlops.tracking.outbox import sync
from tfmlops.tracking.run import StageRun, attach_run, pinned_requirements, stage_run, stage_runs
from tfmlops.tracking.sidecar import discard_sidecar, sidecar_run, start_sidecar
from tfmlops.tracking.uri import (
    artifact_location,
    ensure_reachable,
    import_mlflow,
    is_chief,
    preflight,
    redact,
    repo_root,
    tracking_uri,
    use_uri,
)

__all__ = [
    "RUN_FILE", "StageRun", "TrackingUnavailable", "artifact_location", "attach_run",
    "dvc_data_hashes", "ensure_reachable", "git_state", "import_mlflow",
    "is_chief", "linked_run_id", "pinned_requirements", "preflight", "read_run_file", "redact",
    "repo_root", "sidecar_run", "start_sidecar", "discard_sidecar", "stage_run", "stage_runs",
    "sync", "tracking_uri", "use_uri",
]
