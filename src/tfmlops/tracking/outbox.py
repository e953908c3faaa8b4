"""The disk outbox: MLflow calls a run could not send, kept for `tfmlops sync`.

Each run that lost its store writes `reports/outbox/<stage>-<run id>[-<pid>].jsonl`,
one op per line (see ops.py), beside a `.files/` folder holding copies of the
files those ops upload (stages move their staging folders after logging).
`sync` replays the files in order against the current store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tfmlops.config import Config
from tfmlops.errors import TrackingUnavailable
from tfmlops.tracking.ops import REPLAYABLE, apply
from tfmlops.tracking.retry import first_line
from tfmlops.tracking.uri import ensure_reachable, redact, tracking_uri, use_uri

OUTBOX_DIR = "outbox"


def outbox_path(cfg: Config, name: str) -> Path:
    """The queue file `name`.jsonl of the project's outbox."""
    return Path(cfg.paths.reports) / OUTBOX_DIR / f"{name}.jsonl"


class Outbox:
    """One queue file and the copies of the files its entries name.

    A run and its child runs share one: each entry names its run, and the
    `.files/<n>` folders are numbered by entry, so they never overwrite each other.
    """

    def __init__(self, path: Path):
        self.path = path
        self.entries = 0  # written to the file by this process

    def queue(self, run_id: str, op: str, payload: dict[str, Any]) -> str | None:
        """Queue one op (copying the file an `artifact` op names); the problem if it cannot be."""
        if op not in REPLAYABLE:
            return f"{op}: not sent and not replayable (the server was away)"
        if op == "artifact":
            source = Path(payload["path"])
            if not source.exists():
                return f"artifact {source}: gone before it could be queued"
            # A copy the outbox owns: stages move their staging folders after logging.
            kept = self.files_folder() / source.name
            if source.is_dir():
                shutil.copytree(source, kept)
            else:
                shutil.copy2(source, kept)
            payload = {**payload, "path": str(kept)}
        self.write(run_id, op, payload)
        return None

    def files_folder(self) -> Path:
        """A fresh folder for the files of the next entry."""
        folder = self.path.with_suffix(".files") / str(self.entries)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def write(self, run_id: str, op: str, payload: dict[str, Any]) -> None:
        """Append one op as it is (the files it names already belong to the outbox)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": run_id, "op": op, "payload": payload}, default=str)
        with self.path.open("a") as fh:
            fh.write(line + "\n")
        self.entries += 1


def sync(cfg: Config) -> dict[str, int]:
    """Replay every queued call in `reports/outbox/` against the current store, in order.

    A file is deleted (with its copied artifacts) once all its calls went through.
    If the store fails midway, the calls not yet sent are kept and the command
    stops with one line: running it again resumes there.
    """
    folder = Path(cfg.paths.reports) / OUTBOX_DIR
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        return {"files": 0, "calls": 0}
    uri = tracking_uri(cfg)
    ensure_reachable(uri, cfg.tracking.connect_timeout_s)
    client = use_uri(uri).MlflowClient()
    sent = 0
    for path in files:
        sent += _replay_file(client, path, uri, sent)
        path.unlink()
        shutil.rmtree(path.with_suffix(".files"), ignore_errors=True)
    return {"files": len(files), "calls": sent}


def _replay_file(client, path: Path, uri: str, sent_before: int) -> int:
    """Send the calls of one queue file; on a failure keep the rest in it and raise."""
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, entry in enumerate(entries):
        try:
            apply(client, entry["run_id"], entry["op"], entry["payload"])
        except Exception as exc:  # noqa: BLE001 - keep what is left, say where it stopped
            rest = "".join(json.dumps(e) + "\n" for e in entries[i:])
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(rest)
            tmp.replace(path)
            raise TrackingUnavailable(
                f"sync stopped at {path.name} call {i + 1} ({entry['op']} of run "
                f"{entry['run_id']}) on {redact(uri)}: {first_line(exc)}; {sent_before + i} calls sent, "
                f"{len(entries) - i} kept; fix the store and run `tfmlops sync` again"
            ) from None
    return len(entries)
