"""The promotion ledger: every decision about @production, kept in the registry as the
registered model's tags, one tag per entry (`tfmlops.ledger.000001`, ...). The ledger is
the source of truth; the `production` alias is its cache.

A tag value holds at most 5,000 characters in MLflow's SQL stores (PostgreSQL enforces
it), so an entry is one small JSON, never one growing document; and the ledger is not a
second registered model, which would show in the UI's model list.

MLflow has no transaction: a move writes a *pending* entry, then the aliases, then
confirms the entry. The next promotion completes a pending entry whose target equals the
alias and marks one that differs aborted, so an interrupted promotion is never taken for
a move made outside tfmlops.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass, replace

PREFIX = "tfmlops.ledger."
VALUE_LIMIT = 5000  # SqlRegisteredModelTag.value is String(5000)
WHY_LIMIT = 1500

# Moves: entries after which @production is `after`.
GATE, APPROVAL, FORCED, ROLLBACK = "gate", "approval", "forced", "rollback"
UPGRADE, OUTSIDE, ADOPT, RELEASE = "found at upgrade", "moved from outside", "adopt", "release"
MOVES = (GATE, APPROVAL, FORCED, ROLLBACK, UPGRADE, OUTSIDE, ADOPT, RELEASE)
# A person's decisions, which hold across `dvc repro` (policy.py).
HOLDS = (FORCED, ROLLBACK, ADOPT, RELEASE)
# Decisions about a version that leave @production where it is.
REFUSED, INCONCLUSIVE, AWAITING, REJECTED = "refused", "inconclusive", "awaiting approval", "rejected"
DECISIONS = (GATE, APPROVAL, FORCED, REFUSED, INCONCLUSIVE, AWAITING, REJECTED)

PENDING, CONFIRMED, ABORTED = "pending", "confirmed", "aborted"


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    version: str | None  # the version decided about
    before: str | None  # @production before
    after: str | None  # @production after (== before unless the entry is a move)
    who: str
    why: str
    commit: str | None  # HEAD of the checkout the decision was made in
    branch: str | None
    run_id: str | None  # the promote run that recorded it
    time: str
    state: str = CONFIRMED
    key: str | None = None  # candidate, production and gate params it was decided on
    against: str | None = None  # the production version the evaluation compared with
    gate: str | None = None  # the gate params and test split alone

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.seq:06d}"

    def text(self) -> str:
        value = json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)
        if len(value) > VALUE_LIMIT:
            raise ValueError(f"ledger entry {self.seq} is {len(value)} characters")
        return value


class Ledger:
    """The entries of one registered model, oldest first."""

    def __init__(self, registry):
        self.registry = registry
        self.entries = parse(registry.model_tags())

    def append(self, kind: str, version, before, after, *, who: str, why: str, commit=None,
               branch=None, run_id=None, state: str = CONFIRMED, key=None, against=None,
               gate=None) -> Entry:
        seq = self.entries[-1].seq + 1 if self.entries else 1
        entry = Entry(seq, kind, _v(version), _v(before), _v(after), who, why[:WHY_LIMIT],
                      commit, branch, run_id, now(), state, key, _v(against), gate)
        self.registry.set_model_tag(entry.tag, entry.text())
        self.entries.append(entry)
        return entry

    def settle(self, entry: Entry, state: str) -> Entry:
        settled = replace(entry, state=state)
        self.registry.set_model_tag(settled.tag, settled.text())
        self.entries[self.entries.index(entry)] = settled
        return settled

    def recover(self, alias: str | None) -> list[Entry]:
        """Settle the pending moves an interrupted promotion left: confirmed when the alias
        holds its target, else aborted. Returns the settled entries."""
        settled = []
        for entry in [e for e in self.entries if e.state == PENDING]:
            settled.append(self.settle(entry, CONFIRMED if entry.after == alias else ABORTED))
        return settled

    @property
    def confirmed(self) -> list[Entry]:
        return [e for e in self.entries if e.state == CONFIRMED]

    @property
    def last_move(self) -> Entry | None:
        return next((e for e in reversed(self.confirmed) if e.kind in MOVES), None)

    @property
    def production(self) -> str | None:
        move = self.last_move
        return move.after if move else None

    @property
    def hold(self) -> Entry | None:
        """The person's decision production stands on (rollback, forced, adopt, release)."""
        move = self.last_move
        return move if move and move.kind in HOLDS else None

    @property
    def unresolved_outside(self) -> Entry | None:
        move = self.last_move
        return move if move and move.kind == OUTSIDE else None

    @property
    def last_commit(self) -> str | None:
        """The commit production was last moved from by tfmlops."""
        return next((e.commit for e in reversed(self.confirmed)
                     if e.kind in MOVES and e.kind not in (UPGRADE, OUTSIDE) and e.commit), None)

    @property
    def first_branch(self) -> str | None:
        return next((e.branch for e in self.confirmed if e.kind in MOVES and e.branch), None)

    def removed(self) -> dict[str, Entry]:
        """{version: the entry} of versions a person took out of production (rolled back
        from, or replaced by a forced or released version) and not put back since."""
        out: dict[str, Entry] = {}
        for e in self.confirmed:
            if e.kind in (ROLLBACK, FORCED, RELEASE) and e.before and e.before != e.after:
                out[e.before] = e
            if e.kind == REJECTED and e.version:
                out[e.version] = e
            if e.kind in MOVES and e.after:
                out.pop(e.after, None)
        return out

    def last_decision(self, version: str) -> Entry | None:
        return next((e for e in reversed(self.confirmed)
                     if e.version == str(version) and e.kind in DECISIONS), None)


def parse(tags: dict[str, str]) -> list[Entry]:
    entries = []
    for key in sorted(k for k in tags if k.startswith(PREFIX)):
        try:
            entries.append(Entry(**json.loads(tags[key])))
        except (TypeError, ValueError):
            continue  # not ours (or damaged): never a reason to fail a promotion
    return sorted(entries, key=lambda e: e.seq)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _v(version) -> str | None:
    return None if version in (None, "", "none", "None") else str(version)
