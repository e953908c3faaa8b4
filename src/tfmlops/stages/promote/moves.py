"""The moves of a promotion, under the registry's promotion lock: reconcile the ledger
with the aliases, gate a candidate, and a person's decisions (force, rollback, approve,
reject, adopt, release).

Every function here runs with the lock held (`still_held()` checks it before the first
write). A move writes a pending ledger entry, then the aliases in an order whose every
prefix is safe for `--rollback` (the version's `promote.replaced` tag, @previous,
@production), then confirms the entry. Each returns the decision record that
`stages/promote/__init__.py` logs and writes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass

from tfmlops.errors import DataError
from tfmlops.registry import AWAITING, CANDIDATE, INCONCLUSIVE, PREVIOUS, PRODUCTION
from tfmlops.stages.promote import ledger as L
from tfmlops.stages.promote.gate import VersionMetrics, evaluate_gate, outcome
from tfmlops.stages.promote.ledger import Entry, Ledger

log = logging.getLogger(__name__)

STATE_ALIASES = {L.REFUSED: CANDIDATE, L.INCONCLUSIVE: INCONCLUSIVE, L.AWAITING: AWAITING}
SERVING_TAG = "serving.runtime"  # export tags every version it registers with it


def experiment_alias(name: str) -> str:
    """`exp-<name>` in the characters an MLflow alias accepts."""
    return "exp-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:200] or "unnamed")


@dataclass(frozen=True)
class Actor:
    """Who acts, from which checkout, in which promote run."""

    who: str
    commit: str | None
    branch: str | None
    run_id: str | None

    def entry(self) -> dict:
        return {"who": self.who, "commit": self.commit, "branch": self.branch, "run_id": self.run_id}


def reconcile(registry, ledger: Ledger, actor: Actor) -> list[str]:
    """Settle what an interrupted promotion left, adopt an @production older than the
    ledger ("found at upgrade"), and record an alias moved outside tfmlops. Notes to log."""
    alias = registry.alias(PRODUCTION)
    notes = [f"an interrupted {e.kind} to version {e.after or 'none'} was found {e.state}"
             for e in ledger.recover(alias)]
    if not ledger.entries:
        if alias:
            ledger.append(L.UPGRADE, alias, None, alias, **actor.entry(),
                          why=f"@production was version {alias} before tfmlops kept a ledger")
            notes.append(f"@production (version {alias}) adopted into the ledger: found at upgrade")
    elif ledger.production != alias:
        before = ledger.production
        ledger.append(L.OUTSIDE, alias, before, alias, **{**actor.entry(), "who": "(outside)"},
                      why=f"seen by {actor.who}: @production is {alias or 'unset'}, the ledger "
                          f"last set it to {before or 'none'}")
        notes.append(f"@production was moved outside tfmlops: version {before or 'none'} -> "
                     f"{alias or 'none'} (recorded)")
    return notes


def gate(cfg, registry, ledger: Ledger, candidate: str, actor: Actor, still_held, *,
         evaluate, key: str | None, gate: str | None = None, experiment: str | None = None,
         out_dir=None, kind: str = L.GATE, why: str = "", accept_inconclusive: bool = False) -> dict:
    """Evaluate both versions, apply the gate, then move or record the outcome. An approval
    (`kind` APPROVAL) moves on a pass, and on an inconclusive result a person accepted."""
    metrics = VersionMetrics.from_tags(candidate, registry.tags(candidate))
    production = registry.alias(PRODUCTION)
    against = (VersionMetrics.from_tags(production, registry.tags(production))
               if production and production != candidate else None)
    evaluation = (evaluate(cfg, registry, candidate, against and production, out_dir)
                  if cfg.promote.gate.evaluate else None)
    checks = evaluate_gate(cfg.promote.gate, metrics, against, evaluation)
    result = outcome(checks)
    undecided = "; ".join(c.message for c in checks if not c.passed)
    still_held()
    record = {"candidate": candidate, "production_before": production, "evaluation": evaluation,
              "checks": [asdict(c) for c in checks], "failed": [c.name for c in checks if not c.passed]}
    stays = f"production stays {'version ' + production if production else 'empty'}"
    if experiment:  # tentative: @exp-<name>, production untouched
        alias = experiment_alias(experiment)
        registry.set_alias(alias, candidate)
        registry.tag_version(candidate, {"promote.outcome": f"experiment:{result}",
                                         "promote.run_id": actor.run_id})
        then = ("apply and commit the experiment, then `dvc repro`, to promote it"
                if result == "passed" else f"committed as it is, `dvc repro` would find it {result}")
        return done(record, "held", production, f"DVC experiment {experiment}: version "
                    f"{candidate} -> @{alias}, not @production (the gate: {result}"
                    f"{': ' + undecided if undecided else ''}); {stays}; {then}",
                    experiment=experiment,
                    reason=f"DVC experiment {experiment}: experiments never move @production")
    if production == candidate:
        return done(record, "unchanged", production, f"version {candidate} already holds @production")
    if result == "passed" and cfg.promote.approval == "required" and kind == L.GATE:
        result = "awaiting_approval"
    if result == "inconclusive" and accept_inconclusive:
        result = "passed"
    state = {"refused": L.REFUSED, "inconclusive": L.INCONCLUSIVE,
             "awaiting_approval": L.AWAITING}.get(result)
    if state:
        mark(registry, candidate, state, actor)
        entry = ledger.append(state, candidate, production, production, **actor.entry(), key=key,
                              against=production, gate=gate, why=(why + "; " if why else "") + (undecided or
                              "the gate passed; promote.approval is required"))
        next_step = {L.REFUSED: "", L.INCONCLUSIVE: f"; a person decides: `tfmlops approve "
                     f"{candidate} --reason ...` or `tfmlops reject {candidate} --reason ...`",
                     L.AWAITING: f"; `tfmlops approve {candidate} --reason ...` moves it"}[state]
        summary = (f"{result.replace('_', ' ')}: version {candidate} (now @"
                   f"{STATE_ALIASES[state]}){': ' + undecided if undecided else ''}; {stays}{next_step}")
        return done(record, result, production, summary, entry=entry)
    entry = move(registry, ledger, kind, candidate, actor, still_held, key=key, against=production,
                 gate=gate, why=why or "the gate passed")
    summary = (f"version {candidate} -> @production" + (f" (replaced version {production}, now "
               "@previous)" if production else " (the first: no production to compare with)")
               + (f"; approved: {why}" if kind == L.APPROVAL else ""))
    return done(record, "promoted" if kind == L.GATE else "approved", candidate, summary,
                entry=entry, reason=entry.why)


def move(registry, ledger: Ledger, kind: str, version: str, actor: Actor, still_held,
         **fields) -> Entry:
    """@production <- `version` (the version it replaces becomes @previous), as a pending
    ledger entry confirmed after the aliases."""
    production = registry.alias(PRODUCTION)
    still_held()
    entry = ledger.append(kind, version, production, version, **actor.entry(),
                          state=L.PENDING, **fields)
    registry.tag_version(version, {"promote.replaced": production or "none"})
    if production:
        registry.set_alias(PREVIOUS, production)
    registry.set_alias(PRODUCTION, version)
    mark(registry, version, None, actor, outcome=kind)
    registry.expect_aliases({PRODUCTION: version, PREVIOUS: production} if production
                            else {PRODUCTION: version})
    return ledger.settle(entry, L.CONFIRMED)


def mark(registry, version: str, state: str | None, actor: Actor, outcome: str | None = None) -> None:
    """Point the alias of `state` at `version` and take the other state aliases off it."""
    aliases = registry.aliases()
    for other, alias in STATE_ALIASES.items():
        if other != state and aliases.get(alias) == version:
            registry.delete_alias(alias)
    if state:
        registry.set_alias(STATE_ALIASES[state], version)
    registry.tag_version(version, {"promote.outcome": (outcome or state).replace(" ", "_"),
                                   "promote.run_id": actor.run_id})


def done(record: dict, outcome: str, after, summary: str, entry: Entry | None = None, **extra) -> dict:
    return {"action": "promote", "outcome": outcome, "forced": False, "experiment": None,
            "reason": summary, **record, "production_after": after, "summary": summary,
            "ledger": entry and entry.seq, **extra}


def person(action: str, candidate, before, after, summary: str, entry: Entry | None,
           outcome: str) -> dict:
    """The decision record of a person's command (no gate evaluation)."""
    return {"action": action, "outcome": outcome, "candidate": candidate, "forced": action == "force",
            "experiment": None, "reason": summary, "production_before": before,
            "production_after": after, "checks": [], "failed": [], "summary": summary,
            "evaluation": None, "ledger": entry and entry.seq}


def force(registry, ledger: Ledger, version: str, actor: Actor, still_held, why: str) -> dict:
    if not registry.exists(version):
        raise DataError(f"version {version} of {registry.name} does not exist; see `mlflow models` "
                        "or the MLflow UI")
    before = registry.alias(PRODUCTION)
    if before == version:
        return person("force", version, before, before, f"version {version} already holds "
                      "@production", None, "unchanged")
    entry = move(registry, ledger, L.FORCED, version, actor, still_held, why=why or "--force")
    return person("force", version, before, version, f"version {version} -> @production, FORCED "
                  f"past the gate by {actor.who}" + (f" ({why})" if why else "") +
                  (f"; version {before} is @previous" if before else ""), entry, "forced")


def roll_back(registry, ledger: Ledger, actor: Actor, still_held, why: str) -> dict:
    """@production <- @previous; @previous <- what that version had replaced.
    @previous == @production: a promotion or rollback stopped between its alias moves;
    production stays and @previous gets back what production replaced."""
    production, previous = registry.alias(PRODUCTION), registry.alias(PREVIOUS)
    if previous is None:
        raise DataError(f"{registry.name} has no @previous version to roll back to")
    repair = previous == production
    older = registry.tags(previous).get("promote.replaced")  # what `previous` replaced
    if older in (None, "none", previous, production) or not registry.exists(older):
        older = None
    still_held()
    entry = None if repair else ledger.append(L.ROLLBACK, previous, production, previous,
                                              **actor.entry(), why=why or "--rollback",
                                              state=L.PENDING)
    if not repair:
        registry.set_alias(PRODUCTION, previous)
    if older:
        registry.set_alias(PREVIOUS, older)
    else:
        registry.delete_alias(PREVIOUS)
    if repair:
        return person("rollback", previous, production, previous, f"@previous pointed at "
                      f"production (version {production}): an interrupted promotion or rollback; "
                      f"@previous is now {'version ' + older if older else 'empty'}, production "
                      "unchanged; run --rollback again to roll back", None, "repaired")
    if production:
        registry.tag_version(production, {"promote.rolled_back_by": actor.run_id})
    registry.expect_aliases({PRODUCTION: previous, PREVIOUS: older})
    entry = ledger.settle(entry, L.CONFIRMED)
    return person("rollback", previous, production, previous,
                  f"rolled back @production from version {production} to {previous}"
                  + (f"; @previous is now version {older}" if older else
                     "; no older version left as @previous") + f" (by {actor.who}"
                  + (f": {why})" if why else ")"), entry, "rolled_back")
