"""Stage `promote`: a gate written as data between the exported version and @production.

The gate (`promote.gate` in params) reads the version tags `export` wrote:
an absolute floor on test accuracy, a tolerated change against the version
holding @production, size and latency budgets, and the parity checks. Pass:
the candidate gets @production and the version it replaced @previous. Fail:
the candidate gets @candidate, production is unchanged, and the stage exits 0
unless `promote.fail_pipeline`. `--rollback` moves @production back to
@previous; `--version N [--force]` promotes a chosen version (forced: the gate
is evaluated and recorded, not applied).

Every alias move happens under the registry's promotion lock, after reading
@production again, so concurrent promotions serialize. Each decision (every
check with its values) goes to `reports/promote.json`, to a `promote` MLflow
run (decision.json) and to the candidate version's tags.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from tfmlops import tracking
from tfmlops.config import Config
from tfmlops.errors import ConfigError, DataError
from tfmlops.files import write_json
from tfmlops.gate import VersionMetrics, evaluate_gate

log = logging.getLogger(__name__)

STAGE = "promote"
REGISTERED_FILE = "registered.json"  # written by export


def run(cfg: Config, rollback: bool = False, version: int | None = None,
        force: bool = False) -> dict:
    from tfmlops.registry import Registry

    if force and version is None:
        raise ConfigError("promote --force needs --version N (the version to promote ungated)")
    if not cfg.tracking.enabled:
        raise DataError("promote needs the MLflow model registry; set tracking.enabled: true")
    candidate = None if rollback else (str(version) if version else exported_version(cfg))
    registry = Registry(cfg)
    out_dir = Path(cfg.paths.reports) / STAGE  # mlflow_run.json; paths.export is export's output
    params = {"promote": cfg.to_dict()["promote"], "rollback": rollback,
              "version": version, "force": force}
    with tracking.stage_run(cfg, STAGE, out_dir, upstream={"export": cfg.paths.export},
                            params=params) as run:
        with registry.promotion_lock() as still_held:
            if rollback:
                decision = roll_back(registry, still_held, run.run_id)
            else:
                decision = decide(cfg, registry, candidate, force, still_held, run.run_id)
        decision.update(model=registry.name, run_id=run.run_id,
                        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        promoted=decision["production_after"] != decision["production_before"])
        run.log_dict(decision, "decision.json")
        run.set_tags({f"tfmlops.promote.{k}": decision.get(k) for k in
                      ("action", "outcome", "candidate", "production_before", "production_after")})
        run.log_metrics({"promoted": int(decision["promoted"]),
                         **{f"gate.{c['name']}": c["value"] for c in decision["checks"]}})
    write_json(Path(cfg.paths.reports) / "promote.json", decision)
    log.info("promote: %s", decision["summary"])
    if decision["outcome"] == "refused" and cfg.promote.fail_pipeline:
        raise DataError(f"{decision['summary']} (promote.fail_pipeline is true)")
    return {"outcome": decision["outcome"], "promoted": decision["promoted"],
            "candidate": decision["candidate"], "production": decision["production_after"]}


def exported_version(cfg: Config) -> str:
    """The version `export` registered (paths.export/registered.json)."""
    path = Path(cfg.paths.export) / REGISTERED_FILE
    if not path.is_file():
        raise DataError(f"{path} not found; run `dvc repro export` first (or pass --version N)")
    registered = json.loads(path.read_text())
    if not registered.get("version"):
        raise DataError(f"{path}: export ran with tracking off, nothing was registered; set "
                        "tracking.enabled: true and run export again")
    if registered.get("name") != cfg.promote.registered_model:
        raise DataError(f"{path} registered '{registered.get('name')}', params name "
                        f"'{cfg.promote.registered_model}' (promote.registered_model); run "
                        "`dvc repro export` again")
    return str(registered["version"])


def decide(cfg: Config, registry, candidate: str, force: bool, still_held, run_id) -> dict:
    """Under the lock: read @production again, apply the gate, move the aliases."""
    from tfmlops.registry import CANDIDATE, PREVIOUS, PRODUCTION

    metrics = VersionMetrics.from_tags(candidate, registry.tags(candidate))
    production = registry.alias(PRODUCTION)
    against = None
    if production and production != candidate:
        against = VersionMetrics.from_tags(production, registry.tags(production))
    checks = evaluate_gate(cfg.promote.gate, metrics, against)
    failed = [c for c in checks if not c.passed]
    still_held()
    if production == candidate:
        outcome, after = "unchanged", production
        summary = f"version {candidate} already holds @production"
    elif not failed or force:
        registry.set_alias(PRODUCTION, candidate)
        if production:
            registry.set_alias(PREVIOUS, production)
        if registry.alias(CANDIDATE) == candidate:
            registry.delete_alias(CANDIDATE)
        outcome, after = ("forced" if failed else "promoted"), candidate
        summary = (f"version {candidate} -> @production"
                   + (f" (replaced version {production}, now @previous)" if production else "")
                   + (f"; FORCED past: {'; '.join(c.message for c in failed)}" if failed else ""))
    else:
        registry.set_alias(CANDIDATE, candidate)
        outcome, after = "refused", production
        summary = (f"refused version {candidate} (now @candidate): "
                   + "; ".join(c.message for c in failed)
                   + f"; production stays {'version ' + production if production else 'empty'}")
    tags = {"promote.outcome": outcome, "promote.run_id": run_id}
    if outcome in ("promoted", "forced"):
        tags["promote.replaced"] = production or "none"
    registry.tag_version(candidate, tags)
    return {"action": "promote", "outcome": outcome, "candidate": candidate, "forced": force,
            "production_before": production, "production_after": after,
            "previous_after": registry.alias(PREVIOUS),
            "checks": [asdict(c) for c in checks], "failed": [c.name for c in failed],
            "summary": summary}


def roll_back(registry, still_held, run_id) -> dict:
    """Under the lock: @production <- @previous; @previous <- what that version had replaced."""
    from tfmlops.registry import PREVIOUS, PRODUCTION

    production, previous = registry.alias(PRODUCTION), registry.alias(PREVIOUS)
    if previous is None:
        raise DataError(f"{registry.name} has no @previous version to roll back to")
    older = registry.tags(previous).get("promote.replaced")
    if older in (None, "none", previous, production) or not registry.exists(older):
        older = None
    still_held()
    registry.set_alias(PRODUCTION, previous)
    if older:
        registry.set_alias(PREVIOUS, older)
    else:
        registry.delete_alias(PREVIOUS)
    if production:
        registry.tag_version(production, {"promote.rolled_back_by": run_id})
    return {"action": "rollback", "outcome": "rolled_back", "candidate": previous,
            "production_before": production, "production_after": previous,
            "previous_after": older, "checks": [], "failed": [],
            "summary": f"rolled back @production from version {production} to {previous}"
                       + (f"; @previous is now version {older}" if older else
                          "; no older version left as @previous")}
