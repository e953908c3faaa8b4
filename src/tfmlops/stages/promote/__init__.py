"""Stage `promote`: @production moves through the gate or a person's recorded decision.

Plain `dvc repro` (DVC runs promote on every repro) gates the version export registered
(`registered.json`) against @production, when the policy allows it (committed work on a
promotion branch, no person's decision standing in the way: policy.py). The gate
(`promote.gate`, stages/promote/gate.py) evaluates both versions on the same current test
split: passed moves @production (the old one becomes @previous, or with `promote.approval:
required` it waits for `tfmlops approve`); inconclusive and refused leave production where
it is. A person's commands: `--version N` (gate a chosen version), `--version N --force`,
`--rollback`, `tfmlops approve|reject N --reason ...`, `--adopt`/`--release` (after an alias
moved outside tfmlops). A `dvc exp run` is tentative: @exp-<name> only.

Every decision goes to the promotion ledger (the registry's record, ledger.py),
`reports/promote.json`, a `promote` MLflow run and the version's tags; the evaluation to
`reports/promote_evaluation.json` and `reports/promote/`. Tracking off: nothing to do.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tfmlops import harness
from tfmlops.artifacts import TAG_PROMOTE, data_version
from tfmlops.errors import DataError
from tfmlops.stage_spec import StageSpec
from tfmlops.stages.promote.compare import show_comparison  # noqa: F401  (`tfmlops compare`)
from tfmlops.stages.promote.history import show_history  # noqa: F401  (`tfmlops history`)

if TYPE_CHECKING:
    from tfmlops.config import Config
    from tfmlops.stages.promote.decide import Request

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="promote",
    help="gated promotion to @production in the MLflow model registry",
    output=None,
    upstream=("export",),
    params=("promote", "tracking.enabled"),
    reports=("promote.json",),
    # the evaluation's figures: production's and the paired difference only when there is
    # a production to compare with
    headline=("outcome", "promoted", "candidate", "production_after",
              "evaluation.candidate.accuracy", "evaluation.production.accuracy",
              "evaluation.paired.difference"),
    run_in_reports=True,
)


def run(cfg: Config, request: Request | None = None, **asked) -> dict:
    """`asked`: rollback=True, version=N, force=True, ... as the CLI's flags (Request.of)."""
    from tfmlops.stages.promote.decide import Request

    request = request or Request.of(**asked)
    params = {"promote": cfg.to_dict()["promote"], "action": request.action,
              "version": request.version, "why": request.why}
    with harness.stage(cfg, SPEC, params=params) as st:
        decision, after = _decide(cfg, st, request)
    if after is not None:  # after the run ended: its last write to the store
        after()
    return summary_of(cfg, decision)


def _decide(cfg: Config, st: harness.Stage, request: Request):
    """(the decision, what to do once its run has ended). One made without evaluating
    anything (tracking off, nothing registered, already decided, a precheck's answer)
    is the stage's `skip`: no run."""
    from tfmlops import tracking
    from tfmlops.project import repo_root
    from tfmlops.stages.promote import decided
    from tfmlops.stages.promote.decide import exported, user, verdict
    from tfmlops.stages.promote.workspace import Checkout

    if not cfg.tracking.enabled:
        return st.skip(finished(verdict("skipped", None, None, "tracking is off (tracking."
                                        "enabled: false): no registry, nothing to promote"))), None
    candidate, registered = (request.version, None) if request.action != "auto" else exported(cfg)
    if request.action == "auto" and candidate is None:
        return st.skip(finished(verdict("skipped", None, None, f"nothing registered: {registered} "
                                        "names no version (export ran with tracking off)"))), None
    reference = cfg.data.contract.reference  # an input, when it is the repository's file
    checkout = Checkout.read(repo_root(), () if Path(reference).is_absolute() else (reference,))
    uri = tracking.tracking_uri(cfg)
    data = data_version(cfg.paths.prepared)
    inputs = decided.inputs(cfg, uri, registered, checkout, data) if registered else None
    if remembered := decided.recall(cfg, inputs):  # DVC removed promote.json: written again
        return st.skip(finished(remembered)), None
    from tfmlops.registry import Registry
    from tfmlops.stages.promote.decide import act, precheck

    registry = Registry(cfg)
    early = precheck(cfg, registry, request, candidate, checkout, data, registered)
    if early is not None:
        decided.remember(cfg, decided.verified(registry, inputs, st.skip(finished(early))), early)
        return early, None
    mlflow_run = st.run  # in this process: registry calls stay synchronous
    from tfmlops.stages.promote.moves import Actor
    from tfmlops.stages.promote.record import record_evaluation

    actor = Actor(user(), checkout.head, checkout.branch, mlflow_run.run_id)
    with registry.promotion_lock() as still_held:
        decision = act(cfg, registry, request, candidate, actor, still_held, checkout=checkout,
                       data=data, out_dir=SPEC.run_dir(cfg), registered=registered)
    if decision.get("evaluation"):  # the whole of it in promote_evaluation.json
        decision["evaluation"] = record_evaluation(cfg, mlflow_run, decision["evaluation"])
    decision.update(model=registry.name, run_id=mlflow_run.run_id, who=actor.who)
    mlflow_run.log_dict(decision, "decision.json")
    mlflow_run.set_tags({f"{TAG_PROMOTE}{k}": decision.get(k) for k in
                         ("action", "outcome", "candidate", "production_before", "production_after")}
                        | {f"{TAG_PROMOTE}summary": decision["summary"][:2000]})
    moved = decision["production_after"] != decision["production_before"]
    mlflow_run.log_metrics({"promoted": int(moved), **{f"gate.{c['name']}": c["value"]
                                                       for c in decision["checks"]
                                                       if isinstance(c["value"], (int, float))}})
    st.report(finished(decision), log_metrics=False)
    if request.action != "auto":
        return decision, None
    return decision, lambda: decided.remember(cfg, decided.verified(registry, inputs, decision),
                                              decision)


def finished(decision: dict) -> dict:
    """The decision with its time and `promoted`, and its one log line."""
    decision.setdefault("time", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    decision["promoted"] = decision["production_after"] != decision["production_before"]
    log.info("promote: %s", decision["summary"])
    return decision


def summary_of(cfg: Config, decision: dict) -> dict:
    """The command's JSON result; a refusal (also one already decided) fails the pipeline
    with promote.fail_pipeline."""
    if decision["outcome"] == "refused" and cfg.promote.fail_pipeline:
        raise DataError(f"{decision['summary']} (promote.fail_pipeline is true)")
    return {"outcome": decision["outcome"], "promoted": decision.get("promoted", False),
            "candidate": decision["candidate"], "production": decision["production_after"],
            **({"already_decided": True} if decision.get("already_decided") else {})}
