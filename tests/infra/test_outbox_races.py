"""The outbox under concurrency (issue 26): `sync` racing a stage that appends loses no
line, a worker restarted under the same pid keeps the copies queued before it, an
artifact whose copy is gone is set aside, not counted as sent, and a run handed over
(issue 47, M7) replayed again after a replay was killed is still one run. Real
processes, real MLflow on a temp SQLite store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import child_env, mlflow_client, stage_runs
from tfmlops import tracking
from tfmlops.tracking.handover import Handover
from tfmlops.tracking.outbox import Outbox, outbox_path

pytestmark = pytest.mark.timeout(300)

# A stage whose store is away: it appends one tag op after another to its queue file.
APPENDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tfmlops.tracking.outbox import Outbox

    path, store, run_id, count = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    box = Outbox(path, store)
    print("appending", flush=True)
    for i in range(count):
        box.write(run_id, "tags", {f"k{i:04d}": str(i)})
        time.sleep(0.005)
""")

# A worker that queues one artifact, as a restarted one would: a fresh Outbox (its
# entry count back at 0) on the same queue file (named by the same pid).
QUEUER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tfmlops.tracking.outbox import Outbox

    path, store, run_id, source = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    assert Outbox(path, store).queue(run_id, "artifact", {"path": source,
                                                          "artifact_path": None}) is None
""")


def finished_run(cfg, tmp_path) -> str:
    with tracking.stage_run(cfg, "outbox-race", tmp_path / "out", params={}) as run:
        pass
    return run.run_id


def test_sync_racing_a_stage_that_appends_loses_no_line(tmp_path, make_cfg, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg()
    run_id = finished_run(cfg, tmp_path)
    path = outbox_path(cfg, f"outbox-race-{run_id}")
    count = 400
    stage = subprocess.Popen([sys.executable, "-c", APPENDER, str(path),
                              tracking.redact(tracking.tracking_uri(cfg)), run_id, str(count)],
                             env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert stage.stdout.readline().strip() == "appending"
        syncs = 0
        while stage.poll() is None:  # each replay reads, sends, then rewrites the file
            tracking.sync(cfg)
            syncs += 1
            time.sleep(0.01)  # the appender shares 2 cores with this loop
        assert stage.wait() == 0
    finally:
        stage.kill()
        stage.wait()
    tracking.sync(cfg)  # what came after the last one
    tags = mlflow_client(cfg).get_run(run_id).data.tags
    missing = [i for i in range(count) if tags.get(f"k{i:04d}") != str(i)]
    assert syncs >= 2 and not missing, f"{len(missing)} lines lost over {syncs} syncs"
    assert not path.exists()


def test_a_worker_restarted_under_the_same_pid_keeps_the_copies_queued_before(tmp_path,
                                                                              make_cfg):
    cfg = make_cfg()
    path = outbox_path(cfg, "tune-0123-4242")  # <stage>-<run>-<pid>: one worker's file
    store = tracking.redact(tracking.tracking_uri(cfg))
    for life in ("first", "second"):
        source = tmp_path / life / "trial.json"  # the same artifact name in both lives
        source.parent.mkdir()
        source.write_text(life)
        subprocess.run([sys.executable, "-c", QUEUER, str(path), store, "0123", str(source)],
                       env=child_env(), check=True, timeout=120)
        source.unlink()  # the outbox keeps its own copy
    copies = [Path(json.loads(line)["payload"]["path"]) for line in path.read_text().splitlines()]
    assert len(set(copies)) == 2
    assert [p.read_text() for p in copies] == ["first", "second"]


def test_an_artifact_whose_copy_is_gone_is_not_counted_as_sent(tmp_path, make_cfg):
    cfg = make_cfg()
    run_id = finished_run(cfg, tmp_path)
    box = Outbox(outbox_path(cfg, f"outbox-race-{run_id}"),
                                 tracking.tracking_uri(cfg))
    report = tmp_path / "report.json"
    report.write_text("{}")
    assert box.queue(run_id, "artifact", {"path": str(report), "artifact_path": "r"}) is None
    box.write(run_id, "tags", {"k": "v"})
    (copy,) = box.path.with_suffix(".files").rglob("report.json")
    copy.unlink()  # a cleaner or a user removed it before the store was back
    assert tracking.sync(cfg) == {"files": 1, "calls": 1, "rejected": 1, "other_store": 0}
    (rejected,) = [json.loads(line) for line in
                   box.path.with_suffix(".rejected").read_text().splitlines()]
    assert rejected["entry"]["op"] == "artifact"
    assert rejected["reason"] == f"artifact {copy} is gone; not sent"
    client = mlflow_client(cfg)
    assert client.get_run(run_id).data.tags["k"] == "v"
    assert not client.list_artifacts(run_id, "r")


def test_an_artifact_that_cannot_be_copied_is_named_not_raised(tmp_path, make_cfg):
    """A file of a logged folder gone (or unreadable) while the outbox copies it: the
    problem is returned, as for a folder gone before the copy, and nothing half-copied
    stays queued. It used to raise out of the stage's logging call (tracking must
    never kill the work). A dangling link makes the copy fail every time."""
    cfg = make_cfg()
    box = Outbox(outbox_path(cfg, "outbox-copy"), tracking.tracking_uri(cfg))
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "trace.json").write_text("{}")
    (folder / "gone.pb").symlink_to(tmp_path / "removed-mid-copy.pb")
    problem = box.queue("run-1", "artifact", {"path": str(folder), "artifact_path": "p"})
    assert problem.startswith(f"artifact {folder}: could not be copied to be queued ("), problem
    assert not box.path.exists()
    assert not any(box.path.with_suffix(".files").rglob("*"))


def test_a_handed_over_run_replayed_again_after_a_killed_replay_is_one_run(tmp_path, make_cfg):
    """A replay killed after it sent everything but before it removed the lines leaves
    the file as it was: the next replay finds the run by its local id (one run, each
    metric once), and the run file waiting for it gets its id."""
    cfg = make_cfg()
    out = tmp_path / "reports" / "prepare"
    handover = Handover(cfg, "prepare")
    handover.write([
        ("start", {"cfg": cfg, "stage": "prepare", "out_dir": str(out), "upstream": None,
                   "facts": {"data_version": "abc"}, "params": {"a": 1}}),
        ("do", ("metrics", {"metrics": {"images_good": 8.0}, "step": None, "timestamp": 1}, None)),
        ("end", "FINISHED")])
    assert tracking.read_run_file(out)["run_id"] is None  # waits for the run's id
    queued = handover.path.read_bytes()
    assert tracking.sync(cfg)["calls"] == 4  # the run, its params, its metrics, its end
    handover.path.write_bytes(queued)  # as the killed replay left it
    assert tracking.sync(cfg)["rejected"] == 0
    (run,) = stage_runs(cfg, "prepare")
    assert run.info.status == "FINISHED" and run.data.params == {"a": "1"}
    assert len(mlflow_client(cfg).get_metric_history(run.info.run_id, "images_good")) == 1
    assert tracking.read_run_file(out) == {
        "stage": "prepare", "run_id": run.info.run_id, "data_version": "abc",
        "tracking_uri": tracking.redact(tracking.tracking_uri(cfg))}
    assert not handover.path.exists() and not handover.files.exists()


def test_runs_handed_over_one_after_another_are_delivered_in_that_order(tmp_path, make_cfg):
    """issue 50: a rerun may hand its run over while an earlier one still waits in the
    outbox (its sidecar busy or killed); whichever replay sends them sends the earlier
    first, so the store's runs end in the order they were made."""
    cfg = make_cfg()
    out = tmp_path / "reports" / "prepare"
    for n in range(6):
        Handover(cfg, "prepare").write([
            ("start", {"cfg": cfg, "stage": "prepare", "out_dir": str(out), "upstream": None,
                       "facts": None, "params": {"n": n}}),
            ("end", "FINISHED")])
    assert tracking.sync(cfg)["rejected"] == 0
    runs = sorted(stage_runs(cfg, "prepare"), key=lambda r: r.info.end_time)
    assert [r.data.params["n"] for r in runs] == [str(n) for n in range(6)]
    assert tracking.read_run_file(out)["run_id"] == runs[-1].info.run_id
