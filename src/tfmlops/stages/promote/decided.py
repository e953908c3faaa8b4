"""A no-op `dvc repro` answers without opening the store: DVC runs promote on every repro
(`always_changed`), and importing MLflow alone costs seconds.

After an automatic decision, `remember` writes `reports/promote/decided.json`: every input
the decision read (registered.json, the promote params, the store's URI, the git
checkout, the test split's data version, DVC_EXP_NAME, tfmlops' version) and the local
SQLite store's file identity (inode, size, mtime of the database and its journals). The
next plain run whose inputs are all equal answers with that decision (`recall`): nothing
in the store was written since, so nothing it holds changed. Any write to the store, from
any process, changes the identity, and the store is read again. A server (http, a SQL
database) has no such identity: there `recall` never answers.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tfmlops import __version__, project
from tfmlops.artifacts import run_dir
from tfmlops.files import read_json, write_json
from tfmlops.stages.promote.workspace import Checkout

FILE = "decided.json"


def inputs(cfg, uri: str, registered: Path, checkout: Checkout, data: str) -> dict | None:
    store = store_identity(uri)
    if store is None:
        return None
    return {"registered": hashlib.sha256(registered.read_bytes()).hexdigest(),
            "promote": cfg.to_dict()["promote"], "uri": uri, "store": store,
            "head": checkout.head, "branch": checkout.branch, "changed": list(checkout.changed),
            "data": data, "experiment": os.environ.get("DVC_EXP_NAME"),
            "tfmlops": __version__}


def store_identity(uri: str) -> list | None:
    """A SQLite store's file change counter (header bytes 24-27, which every committed
    write transaction increments), and (name, inode, size, mtime_ns) of its database and
    journal files (a WAL-mode database changes its -wal file instead)."""
    if not uri.startswith(project.SQLITE):
        return None
    db = project.local_store(uri)[0]
    try:
        with open(db, "rb") as fh:
            found: list = [int.from_bytes(fh.read(100)[24:28], "big")]
    except OSError:
        return None
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-journal")):
        try:
            st = path.stat()
        except OSError:
            continue
        found.append([path.name, st.st_ino, st.st_size, st.st_mtime_ns])
    return found


def recall(cfg, now: dict | None) -> dict | None:
    """The decision remembered for exactly these inputs, as this run's answer, else None.
    A version it promoted now holds @production; any other outcome stands as decided."""
    if now is None:
        return None
    saved = read_json(run_dir(cfg, "promote") / FILE, {})
    if saved.get("inputs") != now or not saved.get("result"):
        return None
    result = dict(saved["result"])
    after = result["production_after"]
    if result["outcome"] in ("promoted", "unchanged"):
        result.update(outcome="unchanged", production_before=after, promoted=False,
                      summary=f"version {after} already holds @production; nothing to do")
    elif not result["summary"].startswith("already decided"):
        result.update(already_decided=True, summary=f"already decided: {result['summary']}"
                      + (f" (run {result['run_id']})" if result.get("run_id") else ""))
    return result


def remember(cfg, now: dict | None, result: dict) -> None:
    if now is not None:
        write_json(run_dir(cfg, "promote") / FILE, {"inputs": now, "result": result})


def verified(registry, inputs: dict | None, decision: dict) -> dict | None:
    """`inputs` with the store's identity now, if the store is as the decision left it and
    nobody wrote to it while we looked; else None (nothing is remembered)."""
    if inputs is None:
        return None
    before = store_identity(registry.uri)
    same = registry.alias("production") == decision["production_after"]
    return {**inputs, "store": before} if same and store_identity(registry.uri) == before \
        else None
