"""The calls a run sends, as (op, JSON payload) pairs, and how each reaches MLflow.

One vocabulary for both paths: `StageRun` sends an op live, and the outbox
stores the same op as a JSON line that `tfmlops sync` sends later through the
same `apply`. A model is not an op: its caller queues its saved file
(an `artifact` op) instead.
"""

from __future__ import annotations

import importlib
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from tfmlops.tracking.retry import first_line

# Ops `tfmlops sync` can replay from a JSON line (arbitrary `run.call(fn)` callables cannot be).
# `create_run` is the outbox's own: a child run (trial, finalist) opened while the
# store was away, or a run a stage handed over, created by `sync`, which then sends its
# calls (outbox.py). `drawn`: a figure a handed-over run draws when it is sent (log_drawn).
REPLAYABLE = {"params", "metrics", "tags", "artifact", "dict", "dataset", "end", "create_run",
              "drawn"}
# A run opened while the store was away has this local id until `sync` creates it.
PENDING = "pending-"
# Error codes of a store that answered and refused: sending again would be refused
# too, so the live path reports and drops the call, and `sync` sets it aside.
REFUSED = frozenset({"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST",
                     "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"})


class Unsendable(Exception):
    """An op that can never be sent (its file is gone, its run was never created)."""

    error_code = "INVALID_STATE"  # one of REFUSED: set aside, never retried


def apply(client, run_id: str, op: str, payload: dict[str, Any]) -> None:
    """Send one op of run `run_id` through an MlflowClient."""
    if op == "metrics":  # params, metrics and tags: one `log_batch` each
        from mlflow.entities import Metric

        stamp = payload.get("timestamp") or now_ms()  # stamped when measured
        step = payload.get("step") or 0
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, step)
                                          for k, v in payload["metrics"].items()])
    elif op in ("params", "tags"):
        from mlflow.entities import Param, RunTag

        entity = Param if op == "params" else RunTag
        client.log_batch(run_id, **{op: [entity(k, v) for k, v in payload.items()]})
    elif op == "artifact":
        path = Path(payload["path"])
        if path.is_dir():
            client.log_artifacts(run_id, str(path), payload.get("artifact_path") or path.name)
        elif path.exists():
            client.log_artifact(run_id, str(path), payload.get("artifact_path"))
        else:  # not sent: never counted as if it were
            raise Unsendable(f"artifact {path} is gone; not sent")
    elif op == "dict":
        client.log_dict(run_id, payload["data"], payload["name"])
    elif op == "dataset":
        warnings.filterwarnings("ignore", message="The specified dataset source")
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        source = resolve_dataset_source(payload["source"])
        ds = MetaDataset(source, name=payload["name"], digest=payload["digest"])
        tag = InputTag(key="mlflow.data.context", value=payload["context"])
        client.log_inputs(run_id, [DatasetInput(ds._to_mlflow_entity(), [tag])])
    elif op == "end":
        client.set_terminated(run_id, payload["status"])
    elif op == "drawn":
        with tempfile.TemporaryDirectory(prefix="tfmlops-drawn-") as folder:
            drawn = _draw(payload, Path(folder))
            apply(client, run_id, "artifact", {"path": str(drawn),
                                               "artifact_path": payload.get("artifact_path")})
    else:
        raise ValueError(f"unknown outbox op {op}")


def drawn_payload(draw, args: tuple, artifact_path: str | None, keep) -> dict[str, Any]:
    """A `drawn` op: `draw(*args, folder)` by its name (one of ours), each Path in `args`
    replaced by `keep(path)` (the outbox's own link to the file, as it is now)."""
    paths = [i for i, a in enumerate(args) if isinstance(a, Path)]
    return {"draw": f"{draw.__module__}:{draw.__qualname__}", "artifact_path": artifact_path,
            "args": [str(keep(a)) if i in paths else a for i, a in enumerate(args)],
            "paths": paths}


def files_of(op: str, payload: dict[str, Any]) -> list[Path]:
    """The files of the outbox an op names (removed once it is sent)."""
    if op == "artifact":
        return [Path(payload["path"])]
    if op == "drawn":
        return [Path(payload["args"][i]) for i in payload.get("paths", ())]
    return []


def _draw(payload: dict[str, Any], folder: Path) -> Path:
    """What a `drawn` op's function draws into `folder`; Unsendable if it cannot be drawn."""
    module, _, name = payload["draw"].partition(":")
    if module.partition(".")[0] != "tfmlops":  # the outbox names only our own functions
        raise Unsendable(f"drawing {payload['draw']}: not one of tfmlops' functions; not sent")
    args = [Path(a) if i in payload.get("paths", ()) else a for i, a in enumerate(payload["args"])]
    try:
        draw = importlib.import_module(module)
        for part in name.split("."):
            draw = getattr(draw, part)
        return Path(draw(*args, folder))
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn blocks nothing
        raise Unsendable(f"drawing {payload['draw']} failed ({type(exc).__name__}: "
                         f"{first_line(exc)}); not sent") from None


def now_ms() -> int:
    """Now, in MLflow's unit (epoch milliseconds): stamped when measured, not when sent."""
    return int(time.time() * 1000)
