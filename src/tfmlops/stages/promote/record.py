"""What promote writes of an evaluation: reports/promote_evaluation.json and the run's
artifacts and metrics."""

from __future__ import annotations

from tfmlops.artifacts import EVALUATION, report_path
from tfmlops.config import Config
from tfmlops.files import write_json


def record_evaluation(cfg: Config, run, evaluation: dict) -> dict:
    """reports/promote_evaluation.json and the promote run's artifacts (that JSON, the
    plots, the per-image table) and metrics; returns the digest promote.json keeps."""
    files = evaluation.pop("files", [])
    path = write_json(report_path(cfg.paths.reports, EVALUATION), evaluation)
    for file in [path, *files]:
        run.log_artifact(file, "evaluation")
    paired = evaluation.get("paired") or {}
    roles = [r for r in ("candidate", "production") if r in evaluation]
    run.log_metrics({"eval.images": evaluation["images"], "eval.excluded": evaluation["excluded"],
                     **{f"eval.{r}.{k}": evaluation[r][k] for r in roles
                        for k in ("accuracy", "ece") if evaluation[r][k] is not None},
                     **{f"eval.paired.{k}": paired[k] for k in ("difference", "low", "high")
                        if k in paired}})
    return {"images": evaluation["images"], "excluded": evaluation["excluded"],
            "exclusion": evaluation["exclusion"], "paired": paired or None,
            **{r: {k: evaluation[r][k] for k in ("version", "runtime", "accuracy", "ece")}
               for r in roles}, "report": str(path)}
