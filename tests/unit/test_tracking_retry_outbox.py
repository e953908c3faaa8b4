"""The shared retry helper and the outbox's file copies (pure Python, no store)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.tracking.outbox import Outbox
from tfmlops.tracking.retry import RetriesExhausted, backoff_s, call_with_retry


class _StoreError(Exception):
    def __init__(self, code: str):
        super().__init__(f"{code}: the store said no\nsecond line")
        self.error_code = code


def test_retry_returns_once_a_call_succeeds():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionError("refused")
        return "ok"

    assert call_with_retry(flaky, attempts=3) == "ok" and len(calls) == 2


def test_retry_raises_a_final_code_at_once_and_gives_up_after_the_attempts():
    calls = []

    def refused():
        calls.append(1)
        raise _StoreError("RESOURCE_ALREADY_EXISTS")

    with pytest.raises(_StoreError):
        call_with_retry(refused, attempts=3, final_codes={"RESOURCE_ALREADY_EXISTS"})
    assert len(calls) == 1
    with pytest.raises(RetriesExhausted) as info:
        call_with_retry(refused, attempts=2)
    assert len(calls) == 3 and info.value.attempts == 2 and isinstance(info.value.last, _StoreError)
    assert "second line" not in str(info.value)


def test_backoff_is_bounded():
    assert [backoff_s(a) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_run_and_its_child_queue_files_without_overwriting_each_other(tmp_path):
    box = Outbox(tmp_path / "outbox" / "tune-run.jsonl")
    sources = []
    for i, run_id in enumerate(["parent", "child", "parent"]):
        src = tmp_path / f"src{i}" / "report.json"
        src.parent.mkdir()
        src.write_text(str(i))
        sources.append(src)
        assert box.queue(run_id, "artifact", {"path": str(src), "artifact_path": None}) is None
    assert box.queue("parent", "figure", {"name": "x.png"}).startswith("figure: not sent")
    entries = [json.loads(line) for line in box.path.read_text().splitlines()]
    assert [e["run_id"] for e in entries] == ["parent", "child", "parent"]
    kept = [e["payload"]["path"] for e in entries]
    assert len(set(kept)) == 3 and [open(p).read() for p in kept] == ["0", "1", "2"]


@settings(max_examples=80, deadline=None)
@given(before=st.binary(max_size=60))
def test_a_line_appended_after_a_torn_one_is_a_line_of_its_own(tmp_path_factory, before):
    """Whatever a kill or a full disk left at the file's end (a line cut anywhere), the
    next line appended is whole on its own line: `sync` sets the torn one aside and
    sends this one, instead of setting both aside glued together (issue 47, L8)."""
    path = tmp_path_factory.mktemp("outbox") / "prepare-run.jsonl"
    path.write_bytes(before)
    box = Outbox(path, "sqlite:///mlflow.db")
    box.write("run", "tags", {"k": "v"})
    line = json.dumps({"run_id": "run", "op": "tags", "payload": {"k": "v"},
                       "store": "sqlite:///mlflow.db"}).encode() + b"\n"
    ended = before if before in (b"",) or before.endswith(b"\n") else before + b"\n"
    assert path.read_bytes() == ended + line
