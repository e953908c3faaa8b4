"""Promotion you can trust: @production moves through the gate or through a person's
recorded decision, and nothing else.

- ledger.py: every decision, in the registry (the source of truth; the alias is its cache).
- policy.py: when plain `dvc repro` may gate at all (committed work, the branch, holds).
- moves.py: reconcile the ledger with the aliases, the gate, force and rollback.
- decisions.py: approve, reject, adopt and release.
- decided.py: a no-op `dvc repro` answers "already decided" without opening the store.

`act` runs under the promotion lock; `precheck` answers without it (and without writing)
when nothing needs recording.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tfmlops.artifacts import REGISTERED, TAG_LINEAGE_COMMIT
from tfmlops.errors import ConfigError, DataError
from tfmlops.registry import PRODUCTION
from tfmlops.stages.promote import decisions, moves
from tfmlops.stages.promote import ledger as L
from tfmlops.stages.promote.ledger import Ledger
from tfmlops.stages.promote.policy import decision_key, gate_key, hold_reason, outside_line
from tfmlops.stages.promote.workspace import Checkout

log = logging.getLogger(__name__)

ACTIONS = ("auto", "gate", "force", "rollback", "approve", "reject", "adopt", "release")
ALREADY = {L.REFUSED: "refused", L.INCONCLUSIVE: "inconclusive", L.AWAITING: "awaiting_approval"}


@dataclass(frozen=True)
class Request:
    """What was asked: `auto` (plain `dvc repro`), `gate` (--version N), or a person's
    command; `why` is the --reason recorded with it."""

    action: str = "auto"
    version: str | None = None
    why: str = ""

    @classmethod
    def of(cls, rollback=False, version=None, force=False, approve=None, reject=None,
           adopt=False, release=False, reason=None) -> Request:
        """The request the CLI's flags make."""
        if force and version is None:
            raise ConfigError("promote --force needs --version N (the version to promote ungated)")
        action = ("rollback" if rollback else "force" if force else "approve" if approve else
                  "reject" if reject else "adopt" if adopt else "release" if release else
                  "gate" if version else "auto")
        chosen = approve or reject or version
        return cls(action, None if chosen is None else str(chosen), reason or "")

    def __post_init__(self):
        needs_version = self.action in ("gate", "force", "approve", "reject")
        if self.action not in ACTIONS or needs_version != (self.version is not None):
            raise ConfigError(f"promote: '{self.action}' {'needs' if needs_version else 'takes no'} "
                              "version number")
        if self.action in ("approve", "reject") and not self.why.strip():
            raise ConfigError(f"tfmlops {self.action} needs --reason TEXT (recorded in the ledger)")


def dvc_experiment() -> str | None:
    """The DVC experiment this process runs in (`dvc exp run` sets DVC_EXP_NAME), else None."""
    return os.environ.get("DVC_EXP_NAME") or None


def user() -> str:
    """Who acts: what MLflow tags a run's `mlflow.user` with (the OS user)."""
    try:
        return getpass.getuser()
    except (ImportError, KeyError, OSError):
        return "unknown"


def needs_reconcile(registry, ledger: Ledger) -> bool:
    """Whether the ledger and @production disagree (something to record under the lock)."""
    alias = registry.alias(PRODUCTION)
    if any(e.state == L.PENDING for e in ledger.entries):
        return True
    return ledger.production != alias if ledger.entries else alias is not None


def precheck(cfg, registry, request: Request, candidate: str | None, checkout: Checkout,
             data: str, registered) -> dict | None:
    """Plain `dvc repro`'s answer when it needs no write: unchanged, held or already
    decided; None when the gate must run or the ledger needs recording (under the lock)."""
    if request.action != "auto" or dvc_experiment():
        return None
    ledger = Ledger(registry)
    if needs_reconcile(registry, ledger):
        return None
    return plan(cfg, registry, ledger, candidate, checkout, data, registered)


def plan(cfg, registry, ledger: Ledger, candidate: str, checkout: Checkout, data: str,
         registered) -> dict | None:
    production = registry.alias(PRODUCTION)
    if outside := ledger.unresolved_outside:
        return verdict("held", candidate, production, f"held: {outside_line(outside)}")
    if elsewhere := foreign(registry, candidate, registered):
        return verdict("held", candidate, production, f"held: {elsewhere}")
    if production == candidate:
        return verdict("unchanged", candidate, production,
                       f"version {candidate} already holds @production; nothing to do")
    commit = registry.tags(candidate).get(TAG_LINEAGE_COMMIT)
    if reason := hold_reason(cfg, ledger, checkout, candidate, commit):
        return verdict("held", candidate, production, f"held: {reason}")
    last = ledger.last_decision(candidate)
    if last is not None and last.kind == L.REFUSED and last.gate == gate_key(cfg, data) \
            and last.key != decision_key(cfg, candidate, production, data):
        return verdict("held", candidate, production, f"held: the gate refused version "
                       f"{candidate} against version {last.against or 'none'} ({last.time}, run "
                       f"{last.run_id}); production has changed since, but a refused version is "
                       "gated again only when the gate's params change, or with `tfmlops "
                       f"promote --version {candidate}`")
    if last is not None and last.key == decision_key(cfg, candidate, production, data) \
            and last.kind in ALREADY:
        return verdict(ALREADY[last.kind], candidate, production, f"already decided: version "
                       f"{candidate} {last.kind} ({last.time}, run {last.run_id}); candidate, "
                       "production and gate params are unchanged", already_decided=True)
    return None


def verdict(outcome: str, candidate, production, summary: str, **extra) -> dict:
    stays = "" if outcome == "unchanged" else \
        f"; production stays {'version ' + production if production else 'empty'}"
    return {"action": "promote", "outcome": outcome, "candidate": candidate, "forced": False,
            "experiment": None, "production_before": production, "production_after": production,
            "checks": [], "failed": [], "reason": summary, "summary": summary + stays,
            "evaluation": None, **extra}


def foreign(registry, candidate: str, registered) -> str | None:
    """Why registered.json's version is not this store's (a teammate's clone with its own
    SQLite store, or MLFLOW_TRACKING_URI pointing elsewhere), else None."""
    facts = json.loads(Path(registered).read_text()) if registered else {}
    if not facts or registry.exists(candidate) and registry.source(candidate) == facts.get("model_uri"):
        return None
    return (f"registered.json names version {candidate} of {facts.get('store') or 'another store'}"
            f", not of this store's {registry.name}: run `dvc repro -f export` to register the "
            "model here")


def act(cfg, registry, request: Request, candidate: str | None, actor: moves.Actor, still_held, *,
        checkout: Checkout, data: str, out_dir, evaluate=None, registered=None) -> dict:
    """Under the promotion lock: reconcile the ledger, then what `request` asks."""
    if evaluate is None:
        from tfmlops.stages.promote.versions import evaluate_versions as evaluate
    ledger = Ledger(registry)
    for note in moves.reconcile(registry, ledger, actor):
        log.warning("promote: %s", note)
    experiment, why = dvc_experiment(), request.why
    if experiment and request.action not in ("auto", "gate"):
        raise DataError(f"under `dvc exp run` (experiment {experiment}) promote never moves "
                        "@production: run `tfmlops promote` outside the experiment")
    if request.action in ("auto", "gate", "approve"):
        version = candidate if request.action != "approve" else request.version
        key = decision_key(cfg, version, registry.alias(PRODUCTION), data)
        if request.action == "approve":
            return decisions.approve(cfg, registry, ledger, version, actor, still_held, why,
                                     evaluate=evaluate, key=key, gate=gate_key(cfg, data),
                                     out_dir=out_dir)
        if request.action == "auto" and not experiment and \
                (early := plan(cfg, registry, ledger, candidate, checkout, data, registered)):
            return early
        return moves.gate(cfg, registry, ledger, version, actor, still_held, evaluate=evaluate,
                          key=key, gate=gate_key(cfg, data), experiment=experiment, out_dir=out_dir,
                          why=why or ("--version" if request.action == "gate" else ""))
    if request.action == "force":
        return moves.force(registry, ledger, request.version, actor, still_held, why)
    if request.action == "rollback":
        return moves.roll_back(registry, ledger, actor, still_held, why)
    if request.action == "reject":
        return decisions.reject(registry, ledger, request.version, actor, still_held, why)
    return getattr(decisions, request.action)(registry, ledger, actor, still_held, why)


def exported(cfg) -> tuple[str | None, Path]:
    """(the version `export` registered, its registered.json)."""
    from tfmlops.artifacts import require

    path = require(Path(cfg.paths.export) / REGISTERED, "export", hint=" (or pass --version N)")
    registered = json.loads(path.read_text())
    if registered.get("version") and registered.get("name") != cfg.promote.registered_model:
        raise DataError(f"{path} registered '{registered.get('name')}', params name "
                        f"'{cfg.promote.registered_model}' (promote.registered_model); run "
                        "`dvc repro export` again")
    return (str(registered["version"]) if registered.get("version") else None), path
