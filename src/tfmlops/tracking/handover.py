"""A finished run a stage hands over instead of waiting for the store, written to the
outbox first (prepare as a command, tracking.wait: false; harness `detach`).

The stage's calls wait in its process until its end (sidecar.py, `_Process` with a
delivery lock). There, before the stage reports success, `Handover.write` turns them
into the lines of one outbox file (outbox.py): the run's opening (a `create_run`
without a parent: its experiment, name, tags and run file), its params, its calls and
its end, fsynced in one write. A file write, no MLflow: the stage stays fast. The files
it logged are already hard links in that file's `.files/` folder (the run's scratch),
and its run file says which handed-over run it waits for (lineage.PENDING_KEY).

Then the detached sidecar replays the file (outbox.deliver_handed_over) and removes what
it sent. If it is killed (the container or CI step ends with the stage), the file stays:
the next stage's run delivers it before it opens, or `tfmlops sync` does.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from tfmlops.files import link_or_copy
from tfmlops.tracking.lineage import PENDING_KEY, write_run_file
from tfmlops.tracking.naming import stage_run_name
from tfmlops.tracking.ops import PENDING, drawn_payload, now_ms
from tfmlops.tracking.outbox import Outbox, outbox_path
from tfmlops.tracking.run import opening_tags, param_batches
from tfmlops.tracking.uri import tracking_uri

Entry = tuple[str, str, dict[str, Any]]  # (run id, op, payload): one outbox line


class Handover:
    """The outbox file a stage's run is handed over in, and its scratch folder."""

    def __init__(self, cfg, stage: str):
        self.cfg, self.stage = cfg, stage
        # The hand-over's time first: `sync` replays the outbox's files in name order, so
        # runs handed over while an earlier one was still being delivered, or left by a
        # killed sidecar, reach the store in the order they were made (sidecar.py).
        self.local_id = f"{PENDING}{time.time_ns():016x}{uuid.uuid4().hex[:16]}"
        self.path = outbox_path(cfg, f"{stage}-{self.local_id}")
        # The hard links of the files the run logs: the outbox's own copies once it is written.
        self.files = self.path.with_suffix(".files")
        self.files.mkdir(parents=True, exist_ok=True)
        self.started = now_ms()

    def write(self, messages: list[tuple[str, Any]]) -> None:
        """Write the run the stage's `messages` (the sidecar's pipe vocabulary) describe,
        on disk when this returns, and its run file, waiting for its id."""
        entries: list[Entry] = []
        opened: dict[str, Any] = {}
        for kind, body in messages:
            if kind == "start":
                opened = body
                entries += self._opening(body)
            elif kind == "do" and body[2] is None:
                entries.append((self.local_id, body[0], body[1]))
            elif kind == "draw":
                entries.append((self.local_id, "drawn", drawn_payload(*body, keep=self._keep)))
            elif kind == "end":
                entries.append((self.local_id, "end", {"status": body}))
            elif kind not in ("detach", "scratch"):  # nested runs, models, perform: replies
                raise TypeError(f"a run handed over cannot hold `{kind}`")
        uri = tracking_uri(self.cfg)
        # The run file first: a reader waits (the delivery lock) until it names the run.
        write_run_file(Path(opened["out_dir"]), self.stage, None, uri,
                       {**(opened["facts"] or {}), PENDING_KEY: self.local_id})
        try:
            Outbox(self.path, uri).write_all(entries)
        except BaseException:
            self.path.unlink(missing_ok=True)  # half a run must not be sent: it is waited for
            raise

    def _opening(self, start: dict[str, Any]) -> list[Entry]:
        """The run's `create_run` line (what stage_run opens it with) and its params."""
        cfg = start["cfg"]
        params = start["params"] if start["params"] is not None else cfg.to_dict()
        create = {"experiment": cfg.tracking.experiment, "name": stage_run_name(self.stage, params),
                  "start_time": self.started, "tags": opening_tags(cfg, self.stage, start["upstream"]),
                  "run_file": {"folder": str(Path(start["out_dir"]).resolve()), "stage": self.stage}}
        return [(self.local_id, "create_run", create),
                *((self.local_id, "params", batch) for batch in param_batches(params))]

    def _keep(self, path: Path) -> Path:
        """A hard link to `path` in the outbox (its content now, whatever replaces it)."""
        kept = self.files / uuid.uuid4().hex / path.name
        kept.parent.mkdir()
        link_or_copy(path, kept)
        return kept
