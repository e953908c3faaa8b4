"""`tfmlops history`: the promotion ledger, oldest first: when, who, which decision, from
which @production version to which, the version decided about, the commit and why."""

from __future__ import annotations

import sys

from tfmlops.stages.promote import ledger as L

HISTORY_COLUMNS = ("time", "user", "decision", "from", "to", "version", "commit", "why")


def history(registry) -> list[dict]:
    """Every ledger entry of the registered model, oldest first (pending and aborted ones
    say so in their decision)."""
    rows = []
    for e in L.Ledger(registry).entries:
        decision = e.kind.replace(" ", "_") + ("" if e.state == L.CONFIRMED else f" ({e.state})")
        rows.append({"seq": e.seq, "time": e.time, "user": e.who, "decision": decision,
                     "from": _version(e.before), "to": _version(e.after),
                     "version": _version(e.version), "commit": (e.commit or "-")[:10],
                     "why": e.why, "run_id": e.run_id, "state": e.state,
                     "moved": e.kind in L.MOVES and e.state == L.CONFIRMED})
    return rows


def history_table(rows: list[dict]) -> str:
    """The rows as aligned text columns, one decision per line."""
    if not rows:
        return "no promotion decisions recorded for this model yet"
    return aligned([HISTORY_COLUMNS, *[[str(r[c]) for c in HISTORY_COLUMNS] for r in rows]])


def aligned(table: list) -> str:
    """Lines of cells (str) as text columns two spaces apart; the last one unpadded, so a
    long last cell (why, a file path) does not widen the others."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)),
                                line[-1]]) for line in table)


def _version(value: str | None) -> str:
    return "-" if value in (None, "", "None", "none") else str(value)


def show_history(cfg, as_json: bool) -> list | None:
    """The command: the rows (`--json`), else the table on stdout (its output, not a log
    line)."""
    from tfmlops.registry import Registry

    rows = history(Registry(cfg))
    if as_json:
        return rows
    sys.stdout.write(history_table(rows) + "\n")
    return None
