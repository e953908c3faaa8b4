"""train adopts tune's final-round fit of the winner instead of fitting it again.

The final round fits the winner exactly as train would (stages/tune/final_fit.py) and
keeps it in `paths.tuned/fit/`. When this run's fingerprint (model/kept_fit.py:
params, data, seed, precision policy, strategy and replicas, TensorFlow and Keras
versions, CPU flags, the fitting code) equals the stored one, train loads that model
and writes the files and MLflow run contents a fresh fit writes: per-epoch metrics,
the resolved settings, the profiled steps. Its timings are the final round's, and the
run says so (`adopted: 1` in reports/train.json, tag `tfmlops.adopted_from_run`).
`tfmlops train --fresh` never adopts. Anything else differing trains afresh, with one
line naming what differs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tfmlops.artifacts import MODEL_FILE
from tfmlops.config import Config
from tfmlops.model import kept_fit
from tfmlops.model.fitting import metrics_of

log = logging.getLogger(__name__)

TAG_ADOPTED_FROM = "tfmlops.adopted_from_run"


def kept_fit_to_adopt(cfg: Config, merged: Config, setup, policy: str) -> Path | None:
    """paths.tuned/fit when this run would fit the same model, else None."""
    if not cfg.train.use_tuned or setup.across_workers:  # not what the round fitted
        return None
    folder, stored = kept_fit.stored_fit(cfg.paths.tuned)
    if stored is None:
        return None
    own = kept_fit.fingerprint(merged, setup.keras, policy, setup.placement)
    differ = kept_fit.differences(stored, own)
    if differ:
        log.info(f"train: tune's final-round fit is not adopted (it differs in "
                 f"{', '.join(differ)}); training afresh")
        return None
    return folder


def adopt_kept_fit(folder: Path, run, profile: Path):
    """The kept model and its history, logged into `run` as a fresh fit logs them;
    returns (model, history rows, the round's fit seconds, its MLflow run id)."""
    from tfmlops.model.trained import load_keras3

    facts = kept_fit.facts_of(folder)
    model = load_keras3(folder / MODEL_FILE)
    rows = kept_fit.history_of(folder)
    for row in rows:
        run.log_metrics(metrics_of(row), step=row["epoch"])
    run.log_params({"resolved": facts.get("resolved", {})})
    source = facts.get("run_id") or "none (tracking off)"
    run.set_tags({TAG_ADOPTED_FROM: source, "tfmlops.adopted_candidate": facts.get("candidate")})
    if (folder / kept_fit.PROFILE).is_dir():  # the profiled steps, as train's own trace
        shutil.copytree(folder / kept_fit.PROFILE, profile, dirs_exist_ok=True)
    log.info(f"train: adopted tune's final-round fit of {facts.get('candidate')} (MLflow run "
             f"{source}): the same params, data, precision, device and code; not trained "
             "again (`tfmlops train --fresh` trains anyway)")
    return model, rows, float(facts.get("fit_seconds", 0.0)), source
