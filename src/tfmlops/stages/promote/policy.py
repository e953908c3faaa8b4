"""When plain `dvc repro` may gate a candidate at all: the rules of a careful release
manager, each a one-line reason to hold (production stays, the stage exits 0).

- An alias move made outside tfmlops waits for a person (`--adopt` or `--release`).
- Only committed work on a promotion branch: no tracked input differs from HEAD
  (workspace.py), and HEAD contains the commit production was last moved from (an older
  checkout, or a teammate behind main, holds).
- A person's decision holds: a version a person took out of production (rolled back,
  replaced by a forced one, rejected) comes back only with `--version N`; while a
  rollback or forced version stands, only a version registered from a commit that
  contains that decision's commit is gated.

`--version N`, `--force`, `--rollback`, `approve` and `reject` are a person's explicit
commands: these rules do not apply to them (the gate still does, unless forced).
"""

from __future__ import annotations

import hashlib
import json

from tfmlops.stages.promote.ledger import Entry, Ledger
from tfmlops.stages.promote.workspace import Checkout, short

DEFAULT_BRANCH = "main"
EXPLICIT = "`tfmlops promote --version N`"


def hold_reason(cfg, ledger: Ledger, checkout: Checkout, candidate: str,
                candidate_commit: str | None) -> str | None:
    """Why plain `dvc repro` must not gate `candidate` now, or None."""
    if outside := ledger.unresolved_outside:
        return outside_line(outside)
    if checkout.head is None:
        return (f"{checkout.root} is not a git repository: plain `dvc repro` promotes only "
                f"committed work; commit it, or use {EXPLICIT}")
    if checkout.changed:
        listed = ", ".join(checkout.changed[:5]) + (" ..." if len(checkout.changed) > 5 else "")
        return (f"uncommitted changes to {listed}: plain `dvc repro` promotes only committed "
                f"work; commit them and run `dvc repro` again (or use {EXPLICIT})")
    allowed = list(cfg.promote.branches) or [ledger.first_branch or DEFAULT_BRANCH]
    if checkout.branch not in allowed:
        where = f"branch {checkout.branch}" if checkout.branch else "a detached HEAD"
        return (f"on {where}: plain `dvc repro` promotes from {', '.join(allowed)} only "
                "(promote.branches)")
    if (last := ledger.last_commit) and checkout.contains(last) is not True:
        return (f"this checkout (HEAD {short(checkout.head)}) does not contain commit "
                f"{short(last)}, which production (version {ledger.production or 'none'}) was "
                "promoted from: pull, or check out the promotion branch")
    if (removed := ledger.removed().get(str(candidate))) is not None:
        return (f"version {candidate} was taken out of production by {removed.who} "
                f"({removed.kind}, {removed.time}: {removed.why[:200]}); only {EXPLICIT} "
                "brings it back")
    if (hold := ledger.hold) and checkout.contains(hold.commit or "", candidate_commit) is not True:
        return (f"production version {hold.after or 'none'} stands on {hold.who}'s {hold.kind} "
                f"at commit {short(hold.commit)} ({hold.time}); version {candidate} was "
                f"registered from commit {short(candidate_commit)}, which does not contain it: "
                f"register a version from a later commit, or use {EXPLICIT}")
    return None


def outside_line(outside: Entry) -> str:
    return (f"@production was moved outside tfmlops from version {outside.before or 'none'} to "
            f"{outside.after or 'none (deleted)'} (seen {outside.time}): run `tfmlops promote "
            f"--adopt` to keep it, or `tfmlops promote --release` to put back version "
            f"{outside.before or 'none'}")


def decision_key(cfg, candidate: str, production: str | None, data: str) -> str:
    """What a gate decision depends on: the two versions, the gate and the test split."""
    return _digest({"candidate": str(candidate), "production": production,
                    "gate": gate_key(cfg, data), "approval": cfg.promote.approval})


def gate_key(cfg, data: str) -> str:
    """The gate's params and the test split: a refusal stands until one of them changes."""
    return _digest({"gate": cfg.to_dict()["promote"]["gate"], "data": data})


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
