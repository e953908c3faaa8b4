"""What the MLflow UI shows: the experiment's kind and each stage run's name; and how a
search names a value (`equals`).

MLflow 3 opens an experiment on its GenAI overview unless the experiment tag
`mlflow.experimentKind` says it holds model training. A stage's run is named
`<stage>-<DVC experiment>` under `dvc exp run`, else `<stage>-<params digest>`,
so a list of runs tells them apart; the `tfmlops.stage` tag stays for filtering.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from tfmlops.tracking.retry import first_line
from tfmlops.tracking.uri import artifact_location

log = logging.getLogger(__name__)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "Model training" view
DIGEST_CHARS = 6


def equals(key: str, value: str) -> str:
    """The search-filter clause `key = value`. MLflow strips a value's quotes and does not
    unescape it (`'bob\\'s'` searches for a backslash), so a value holding a single quote
    goes in double quotes; one holding both kinds cannot be searched for."""
    value = str(value)
    if "'" in value and '"' in value:
        raise ValueError(f"{value!r} holds both quote kinds: MLflow cannot search for it")
    quote = '"' if "'" in value else "'"
    return f"{key} = {quote}{value}{quote}"


def stage_run_name(stage: str, params: dict[str, Any]) -> str:
    """`train-<dvc exp name>`, else `train-3f9a1c` (same params, same name)."""
    if exp_name := os.environ.get("DVC_EXP_NAME"):
        return f"{stage}-{exp_name}"
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return f"{stage}-{hashlib.sha256(blob).hexdigest()[:DIGEST_CHARS]}"


def experiment_id_of(mlflow, name: str, uri: str) -> str:
    """The id of experiment `name`, created (with its kind tag) if missing."""
    mlflow_client = mlflow.MlflowClient()
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is None:
        try:
            return mlflow_client.create_experiment(
                name, artifact_location=artifact_location(uri),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # noqa: BLE001 - another process created it first
            exp = mlflow_client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in (exp.tags or {}):  # created before this tag existed
        try:
            mlflow_client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception as exc:  # noqa: BLE001 - a UI hint never stops a stage's run
            log.warning("tfmlops: could not tag experiment %s with %s: %s", exp.name,
                        EXPERIMENT_KIND_TAG, first_line(exc))  # credentials redacted
    return exp.experiment_id
