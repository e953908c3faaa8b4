"""Stage `promote`: a gate written as data between the exported version and @production.

The gate (`promote.gate` in params) reads both versions' evaluation on the same
current test split, as each would serve (serving/versions.py): a floor on accuracy,
the paired change against the version holding @production (refused only when worse
beyond max_regression with `confidence`), per-class recall floors and drops, a
calibration ceiling; and the version tags `export` wrote: size and latency budgets,
the parity checks, the INT8 edge file's agreement with the float model. Pass:
the candidate gets @production and the version it replaced @previous. Fail:
the candidate gets @candidate, production is unchanged, and the stage exits 0
unless `promote.fail_pipeline`. `--rollback` moves @production back to @previous;
`--version N [--force]` promotes a chosen version (forced: the gate is not applied).

DVC runs the stage on every `dvc repro` (an applied experiment changes none of its
deps); when the exported version holds @production it only says so in promote.json.
A promotion run by `dvc exp run` (DVC sets DVC_EXP_NAME; the run is tagged
`dvc.exp_name`) is tentative: the gate is evaluated and recorded, the version
gets @exp-<name>, and @production is left alone unless `promote.from_experiments`.

Every alias move happens under the registry's promotion lock, after reading
@production again, so concurrent promotions serialize. The writes of a
promotion go in an order whose every prefix is safe for `--rollback`: the
candidate's `promote.replaced` tag, then @previous, then @production. Each decision goes
to `reports/promote.json`, a `promote` MLflow run and the candidate version's tags; the
evaluation to `reports/promote_evaluation.json` and `reports/promote/` (plots, per image).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tfmlops import harness
from tfmlops.artifacts import REGISTERED, TAG_PROMOTE, report_path, require, run_dir
from tfmlops.config import Config
from tfmlops.errors import ConfigError, DataError
from tfmlops.files import write_json
from tfmlops.promotion import decide, dvc_experiment, record_evaluation, roll_back

log = logging.getLogger(__name__)

STAGE = "promote"


def run(cfg: Config, rollback: bool = False, version: int | None = None,
        force: bool = False) -> dict:
    from tfmlops.registry import Registry

    if force and version is None:
        raise ConfigError("promote --force needs --version N (the version to promote ungated)")
    if not cfg.tracking.enabled:
        raise DataError("promote needs the MLflow model registry; set tracking.enabled: true")
    candidate = None if rollback else (str(version) if version else exported_version(cfg))
    registry = Registry(cfg)
    if candidate and not version and (cfg.promote.from_experiments or not dvc_experiment()) \
            and registry.alias("production") == candidate:
        return unchanged(cfg, registry.name, candidate)  # dvc runs promote on every repro
    out_dir = run_dir(cfg, STAGE)  # mlflow_run.json; paths.export is export's output
    params = {"promote": cfg.to_dict()["promote"], "rollback": rollback,
              "version": version, "force": force}
    # In this process (no sidecar): registry calls stay synchronous, so the decision is
    # recorded before the run ends.
    with harness.stage(cfg, STAGE, run_dir=out_dir, upstream=("export",),
                       params=params) as st:
        run = st.run
        with registry.promotion_lock() as still_held:
            if rollback:
                decision = roll_back(registry, still_held, run.run_id)
            else:
                decision = decide(cfg, registry, candidate, force, still_held, run.run_id,
                                  experiment=dvc_experiment(), out_dir=out_dir)
        if decision.get("evaluation"):  # the whole of it in promote_evaluation.json
            decision["evaluation"] = record_evaluation(cfg, run, decision["evaluation"])
        decision.update(model=registry.name, run_id=run.run_id,
                        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        promoted=decision["production_after"] != decision["production_before"])
        run.log_dict(decision, "decision.json")
        run.set_tags({f"{TAG_PROMOTE}{k}": decision.get(k) for k in
                      ("action", "outcome", "candidate", "production_before", "production_after")}
                     | {f"{TAG_PROMOTE}summary": decision["summary"][:2000]})  # `tfmlops history`
        run.log_metrics({"promoted": int(decision["promoted"]),
                         **{f"gate.{c['name']}": c["value"] for c in decision["checks"]}})
        st.report(decision, log_metrics=False)
    log.info("promote: %s", decision["summary"])
    if decision["outcome"] == "refused" and cfg.promote.fail_pipeline:
        raise DataError(f"{decision['summary']} (promote.fail_pipeline is true)")
    return {"outcome": decision["outcome"], "promoted": decision["promoted"],
            "candidate": decision["candidate"], "production": decision["production_after"]}


def unchanged(cfg: Config, name: str, candidate: str) -> dict:
    """The exported version holds @production already: nothing to gate, move or record."""
    summary = f"version {candidate} already holds @production; nothing to do"
    result = {"outcome": "unchanged", "promoted": False, "candidate": candidate}
    write_json(report_path(cfg.paths.reports, STAGE), {
        **result, "action": "promote", "model": name, "production_before": candidate,
        "production_after": candidate, "checks": [], "failed": [], "reason": summary,
        "summary": summary, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    log.info("promote: %s", summary)
    return {**result, "production": candidate}


def exported_version(cfg: Config) -> str:
    """The version `export` registered (paths.export/registered.json)."""
    path = require(Path(cfg.paths.export) / REGISTERED, "export", hint=" (or pass --version N)")
    registered = json.loads(path.read_text())
    if not registered.get("version"):
        raise DataError(f"{path}: export ran with tracking off, nothing was registered; set "
                        "tracking.enabled: true and run export again")
    if registered.get("name") != cfg.promote.registered_model:
        raise DataError(f"{path} registered '{registered.get('name')}', params name "
                        f"'{cfg.promote.registered_model}' (promote.registered_model); run "
                        "`dvc repro export` again")
    return str(registered["version"])
