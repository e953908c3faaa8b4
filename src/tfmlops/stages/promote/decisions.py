"""A person's decisions on a gated version (approve, reject) and on an alias moved outside
tfmlops (adopt, release), under the promotion lock.

Approval is a workflow, not an access control: anyone with EDIT on the registered model
can move an alias in MLflow (open-source MLflow has no per-alias permission). The ledger
records who (`mlflow.user`: the client's claim, the authenticated user behind MLflow's
basic-auth app) and why; an alias moved around it is detected and held (moves.reconcile).
"""

from __future__ import annotations

from tfmlops.errors import DataError
from tfmlops.registry import PRODUCTION
from tfmlops.stages.promote import ledger as L
from tfmlops.stages.promote.ledger import Ledger
from tfmlops.stages.promote.moves import SERVING_TAG, Actor, mark, move, person
from tfmlops.stages.promote.moves import gate as gate_version


def approve(cfg, registry, ledger: Ledger, version: str, actor: Actor, still_held, why: str,
            *, evaluate, key: str, gate: str, out_dir) -> dict:
    """Move a version awaiting approval (or inconclusive) to @production. Its request was
    evaluated against a production that has since changed: gated again first."""
    production = registry.alias(PRODUCTION)
    if production == version:
        return person("approve", version, production, production,
                      f"version {version} already holds @production", None, "unchanged")
    last = ledger.last_decision(version)
    if last is None or last.kind not in (L.AWAITING, L.INCONCLUSIVE):
        raise DataError(f"version {version} cannot be approved: " + _not_approvable(version, last))
    if last.against != production:
        return gate_version(cfg, registry, ledger, version, actor, still_held, evaluate=evaluate,
                            key=key, gate=gate, out_dir=out_dir, kind=L.APPROVAL,
                            accept_inconclusive=last.kind == L.INCONCLUSIVE,
                            why=f"approved by {actor.who}: {why} (gated again: its request was "
                                f"evaluated against version {last.against or 'none'}, production "
                                f"is now {production or 'empty'})")
    entry = move(registry, ledger, L.APPROVAL, version, actor, still_held, key=last.key,
                 against=production, why=why)
    return person("approve", version, production, version, f"version {version} -> @production, "
                  f"approved by {actor.who}: {why}" + (f" (replaced version {production}, now "
                  "@previous)" if production else ""), entry, "approved")


def _not_approvable(version: str, last) -> str:
    if last is None:
        return f"it has not been gated; run `tfmlops promote --version {version}` first"
    if last.kind == L.REFUSED:
        return (f"the gate refused it ({last.time}, run {last.run_id}); a refused version "
                f"moves only with `tfmlops promote --version {version} --force`")
    if last.kind == L.REJECTED:
        return (f"{last.who} rejected it ({last.time}: {last.why[:200]}); "
                f"`tfmlops promote --version {version}` gates it again")
    return f"its last decision is '{last.kind}' ({last.time}); nothing awaits approval"


def reject(registry, ledger: Ledger, version: str, actor: Actor, still_held, why: str) -> dict:
    """Record a person's no: the version leaves the state aliases and comes back only with
    `tfmlops promote --version N`."""
    if not registry.exists(version):
        raise DataError(f"version {version} of {registry.name} does not exist")
    production = registry.alias(PRODUCTION)
    if production == version:
        raise DataError(f"version {version} holds @production: `tfmlops promote --rollback` "
                        "takes it out")
    still_held()
    mark(registry, version, None, actor, outcome="rejected")
    entry = ledger.append(L.REJECTED, version, production, production, **actor.entry(), why=why)
    return person("reject", version, production, production, f"version {version} rejected by "
                  f"{actor.who}: {why}; production stays "
                  f"{'version ' + production if production else 'empty'}", entry, "rejected")


def adopt(registry, ledger: Ledger, actor: Actor, still_held, why: str) -> dict:
    """Keep the version an outside move put in @production; the gate compares with it."""
    outside = _outside(ledger, "adopt")
    version = registry.alias(PRODUCTION)
    if version and SERVING_TAG not in registry.tags(version):
        raise DataError(f"version {version} is not a tfmlops serving model (no '{SERVING_TAG}' "
                        "tag), so the gate cannot evaluate against it: `tfmlops promote "
                        f"--release` puts back version {_origin(ledger) or 'none'}, or "
                        "`tfmlops promote --version N --force` promotes another")
    still_held()
    entry = ledger.append(L.ADOPT, version, outside.after, version, **actor.entry(),
                          why=why or "adopted the outside move")
    return person("adopt", version, outside.before, version, f"adopted the outside move: "
                  f"@production stays {'version ' + version if version else 'empty'} "
                  f"(by {actor.who})", entry, "adopted")


def release(registry, ledger: Ledger, actor: Actor, still_held, why: str) -> dict:
    """Undo an outside move: @production back to the version the ledger had."""
    _outside(ledger, "release")
    target, current = _origin(ledger), registry.alias(PRODUCTION)
    if target and not registry.exists(target):
        raise DataError(f"version {target} no longer exists: `tfmlops promote --adopt` keeps "
                        "@production as it is, or `tfmlops promote --version N --force`")
    still_held()
    entry = ledger.append(L.RELEASE, target, current, target, **actor.entry(), state=L.PENDING,
                          why=why or "released the outside move")
    if target:
        registry.set_alias(PRODUCTION, target)
    else:
        registry.delete_alias(PRODUCTION)
    registry.expect_aliases({PRODUCTION: target})
    entry = ledger.settle(entry, L.CONFIRMED)
    return person("release", target, current, target, f"released the outside move: @production "
                  f"back to {'version ' + target if target else 'empty'} from "
                  f"{current or 'empty'} (by {actor.who})", entry, "released")


def _outside(ledger: Ledger, what: str):
    outside = ledger.unresolved_outside
    if outside is None:
        raise DataError(f"nothing to {what}: @production was not moved outside tfmlops since "
                        "its last recorded decision (see `tfmlops history`)")
    return outside


def _origin(ledger: Ledger) -> str | None:
    """@production before the run of outside moves that ends the ledger."""
    moves = [e for e in ledger.confirmed if e.kind in L.MOVES]
    origin = None
    for entry in reversed(moves):
        if entry.kind != L.OUTSIDE:
            break
        origin = entry.before
    return origin
