"""The moves of a promotion, under the registry's promotion lock: gate, aliases, rollback.

Every function here runs with the lock held (`still_held()` checks it before the
first alias move) and reads @production again first, so concurrent promotions
serialize. The writes go in an order whose every prefix is safe for `--rollback`:
the candidate's `promote.replaced` tag, then @previous, then @production. Each
returns the decision record `stages/promote.py` logs and writes.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import asdict
from pathlib import Path

from tfmlops.artifacts import EVALUATION, TAG_PROMOTE, report_path
from tfmlops.config import Config
from tfmlops.errors import DataError
from tfmlops.files import write_json
from tfmlops.gate import VersionMetrics, evaluate_gate
from tfmlops.registry import CANDIDATE, PREVIOUS, PRODUCTION
from tfmlops.tracking import stage_runs


def dvc_experiment() -> str | None:
    """The DVC experiment this process runs in (`dvc exp run` sets DVC_EXP_NAME), else None."""
    return os.environ.get("DVC_EXP_NAME") or None


def experiment_alias(name: str) -> str:
    """`exp-<name>` in the characters an MLflow alias accepts."""
    return "exp-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:200] or "unnamed")


def decide(cfg: Config, registry, candidate: str, force: bool, still_held, run_id,
           experiment: str | None = None, out_dir: Path | None = None) -> dict:
    """Under the lock: read @production again, evaluate both versions on the current test
    split (files in `out_dir`), apply the gate, move the aliases."""
    from tfmlops.serving.versions import evaluate_versions

    metrics = VersionMetrics.from_tags(candidate, registry.tags(candidate))
    production = registry.alias(PRODUCTION)
    against = (VersionMetrics.from_tags(production, registry.tags(production))
               if production and production != candidate else None)
    evaluation = (evaluate_versions(cfg, registry, candidate, against and production,
                                    out_dir or Path(cfg.paths.reports) / "promote")
                  if cfg.promote.gate.evaluate else None)
    checks = evaluate_gate(cfg.promote.gate, metrics, against, evaluation)
    failed = [c for c in checks if not c.passed]
    still_held()
    reasons = "; ".join(c.message for c in failed)
    stays = f"production stays {'version ' + production if production else 'empty'}"
    if experiment and not cfg.promote.from_experiments:
        # A DVC experiment's version: @exp-<name>, production untouched.
        alias = experiment_alias(experiment)
        registry.set_alias(alias, candidate)
        refused = bool(failed) and not force
        outcome, after = ("refused" if refused else "held"), production
        gate = f"the gate refused it: {reasons}" if refused else "the gate passed"
        summary = (f"DVC experiment {experiment}: version {candidate} -> @{alias}, not @production "
                   f"({gate}); {stays}; apply and commit the experiment, then `dvc repro`, to "
                   "promote it")
        reason = (f"DVC experiment {experiment}: experiments never move @production "
                  "(promote.from_experiments is false)")
        expected = {alias: candidate, PRODUCTION: production}
    elif production == candidate:
        outcome, after = "unchanged", production
        summary = reason = f"version {candidate} already holds @production"
        expected = {PRODUCTION: candidate}
    elif not failed or force:
        registry.tag_version(candidate, {"promote.replaced": production or "none"})
        if production:
            registry.set_alias(PREVIOUS, production)
        registry.set_alias(PRODUCTION, candidate)
        if registry.alias(CANDIDATE) == candidate:
            registry.delete_alias(CANDIDATE)
        outcome, after = ("forced" if failed else "promoted"), candidate
        summary = (f"version {candidate} -> @production"
                   + (f" (replaced version {production}, now @previous)" if production else "")
                   + (f"; FORCED past: {reasons}" if failed else ""))
        reason = f"forced past the gate: {reasons}" if failed else "the gate passed"
        expected = {PRODUCTION: candidate, PREVIOUS: production} if production else {PRODUCTION: candidate}
    else:
        registry.set_alias(CANDIDATE, candidate)
        outcome, after = "refused", production
        summary = f"refused version {candidate} (now @candidate): {reasons}; {stays}"
        reason = f"the gate failed: {reasons}"
        expected = {CANDIDATE: candidate, PRODUCTION: production}
    registry.tag_version(candidate, {"promote.outcome": outcome, "promote.run_id": run_id})
    registry.expect_aliases(expected)  # a writer outside the lock: a conflict, said so
    return {"action": "promote", "outcome": outcome, "candidate": candidate, "forced": force,
            "experiment": experiment, "reason": reason, "production_before": production,
            "production_after": after, "previous_after": registry.alias(PREVIOUS),
            "checks": [asdict(c) for c in checks], "failed": [c.name for c in failed],
            "summary": summary, "evaluation": evaluation}


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


def roll_back(registry, still_held, run_id) -> dict:
    """Under the lock: @production <- @previous; @previous <- what that version had replaced.
    @previous == @production: a promotion or rollback stopped between its alias moves.
    Production never moved to anything unchecked, so it stays; @previous gets back what
    production replaced. Nothing is rolled back: a second --rollback does that."""
    production, previous = registry.alias(PRODUCTION), registry.alias(PREVIOUS)
    if previous is None:
        raise DataError(f"{registry.name} has no @previous version to roll back to")
    repair = previous == production
    older = registry.tags(previous).get("promote.replaced")  # what `previous` replaced
    if older in (None, "none", previous, production) or not registry.exists(older):
        older = None
    still_held()
    if not repair:
        registry.set_alias(PRODUCTION, previous)
    if older:
        registry.set_alias(PREVIOUS, older)
    else:
        registry.delete_alias(PREVIOUS)
    if repair:
        outcome, reason = "repaired", "an interrupted alias move left @previous == @production"
        summary = (f"@previous pointed at production (version {production}): an interrupted "
                   f"promotion or rollback; @previous is now "
                   f"{'version ' + older if older else 'empty'}, production unchanged; run "
                   "--rollback again to roll back")
    else:
        if production:
            registry.tag_version(production, {"promote.rolled_back_by": run_id})
        registry.expect_aliases({PRODUCTION: previous, PREVIOUS: older})
        outcome, reason = "rolled_back", "--rollback"
        summary = (f"rolled back @production from version {production} to {previous}"
                   + (f"; @previous is now version {older}" if older else
                      "; no older version left as @previous"))
    # repaired: `previous` is production, which stays
    return {"action": "rollback", "outcome": outcome, "candidate": previous, "production_before": production,
            "production_after": previous, "previous_after": older, "checks": [], "failed": [],
            "experiment": None, "reason": reason, "summary": summary}


HISTORY_COLUMNS = ("time", "user", "action", "outcome", "from", "to", "candidate", "why")


def history(cfg: Config) -> list[dict]:
    """Every promote run of the params' registered model, oldest first: who, when, which
    action, from which @production version to which, and why (its decision's summary)."""
    rows = []
    model = {"promote.registered_model": cfg.promote.registered_model}
    for run in stage_runs(cfg, "promote", params=model):
        tags = run["tags"]
        decided = {k: tags.get(TAG_PROMOTE + k) or "" for k in
                   ("action", "outcome", "candidate", "production_before", "production_after", "summary")}
        when = datetime.datetime.fromtimestamp(run["start_time"] / 1000, datetime.UTC)
        rows.append({"time": when.strftime("%Y-%m-%dT%H:%M:%SZ"), "user": tags.get("mlflow.user", ""),
                     "action": decided["action"],
                     "outcome": decided["outcome"] or f"(no decision: run {run['status']})",
                     "from": _version(decided["production_before"]),
                     "to": _version(decided["production_after"]),
                     "candidate": _version(decided["candidate"]),
                     "why": decided["summary"], "run_id": run["run_id"]})
    return rows


def history_table(rows: list[dict]) -> str:
    """The rows as aligned text columns, one promotion per line."""
    if not rows:
        return "no promote runs in this experiment yet"
    table = [HISTORY_COLUMNS, *[[str(r[c]) for c in HISTORY_COLUMNS] for r in rows]]
    widths = [max(len(line[i]) for line in table) for i in range(len(HISTORY_COLUMNS) - 1)]
    padded = [[*(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)), line[-1]]
              for line in table]
    return "\n".join("  ".join(cells) for cells in padded)


def _version(value: str | None) -> str:
    return "-" if value in (None, "", "None", "none") else str(value)
