"""Issue 14.4: a SIGKILLed stage leaves its MLflow run RUNNING; the next run of that
stage (same repo, same store) marks it KILLED once its owner process is provably gone.
Issue 26: a run owned on another machine is closed once its heartbeat stopped for
longer than the threshold, never while it beats or during a short outage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import child_env, mlflow_client
from tfmlops import tracking
from tfmlops.artifacts import TAG_STAGE
from tfmlops.tracking import heartbeat, stale
from tfmlops.tracking.heartbeat import HEARTBEAT_TAG
from tfmlops.tracking.retry import retry_window_s
from tfmlops.tracking.uri import attempt_bound_s

pytestmark = pytest.mark.timeout(300)

HOLDER = textwrap.dedent("""
    import json, sys, time
    from tfmlops import tracking
    from tfmlops.config import load_config

    cfg = load_config("params.yaml")
    with tracking.stage_run(cfg, sys.argv[1], "out-" + sys.argv[1]) as run:
        child = run.start_child("trial-0")
        print(json.dumps({"run": run.run_id, "child": child.run_id}), flush=True)
        time.sleep(600)
""")


def start_holder(cwd, stage: str) -> tuple[subprocess.Popen, dict]:
    """A real process holding an open run (and a child run) of `stage`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, stage], cwd=cwd, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:]
    return proc, json.loads(line)


def status(client, run_id: str) -> str:
    return client.get_run(run_id).info.status


@pytest.mark.slow
def test_killed_stage_runs_are_closed_by_the_next_run_of_that_stage(tmp_path, make_cfg,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)  # the repo root of the holders and of this process
    cfg = make_cfg()
    killed, ids = start_holder(tmp_path, "prepare")
    alive, alive_ids = start_holder(tmp_path, "prepare")
    other, other_ids = start_holder(tmp_path, "train")
    try:
        for proc in (killed, other):
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        client = mlflow_client(cfg)
        assert status(client, ids["run"]) == "RUNNING"  # what a kill used to leave forever
        assert status(client, ids["child"]) == "RUNNING"
        tags = client.get_run(ids["run"]).data.tags
        assert tags["tfmlops.owner.pid"] == str(killed.pid) and tags["tfmlops.owner.start"]

        with tracking.stage_run(cfg, "prepare", tmp_path / "out") as run:
            pass
        assert status(client, ids["run"]) == "KILLED"
        assert status(client, ids["child"]) == "KILLED"
        reason = client.get_run(ids["run"]).data.tags[stale.KILLED_TAG]
        assert reason == f"owner process gone; closed by run {run.run_id} of prepare"
        assert status(client, alive_ids["run"]) == "RUNNING"  # its owner still runs
        assert status(client, alive_ids["child"]) == "RUNNING"
        assert status(client, other_ids["run"]) == "RUNNING"  # another stage: its own next run
        assert status(client, run.run_id) == "FINISHED"
    finally:
        for proc in (killed, alive, other):
            proc.kill()
            proc.wait()


def test_owner_judged_only_where_it_can_be(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    me = stale.owner_tags()
    assert not stale.owner_gone(me)
    assert stale.owner_gone({**me, "tfmlops.owner.start": "1"})  # the pid was reused
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert stale.owner_gone({**me, "tfmlops.owner.pid": str(gone.pid)})
    # another host or container: unknowable from here, left alone
    assert not stale.owner_gone({**me, "tfmlops.owner.pid": str(gone.pid),
                                 "tfmlops.owner.host": "elsewhere"})
    assert not stale.owner_gone({**me, "tfmlops.owner.pid": str(gone.pid),
                                 "tfmlops.owner.pidns": "1"})
    assert not stale.owner_gone({})  # a run opened before owner tags existed


def forge_remote_run(client, experiment_id: str, stage: str) -> str:
    """A RUNNING run as a stage on another machine opens it: its owner tags name
    another host and boot, and its heartbeat stands at 3."""
    tags = {**stale.owner_tags(), "tfmlops.owner.host": "elsewhere",
            "tfmlops.owner.boot": "another-boot", TAG_STAGE: stage, HEARTBEAT_TAG: "3"}
    return client.create_run(experiment_id, tags=tags).info.run_id


def test_orphans_beyond_one_search_page_are_closed_too(tmp_path, make_cfg, monkeypatch):
    """More RUNNING runs than one search returns (many killed workers): every orphan is
    found, page by page. The page is 2 here, so 5 orphans take 3 pages."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stale, "SEARCH_PAGE", 2)
    cfg = make_cfg()
    with tracking.stage_run(cfg, "prepare", tmp_path / "out") as first:
        pass
    client = mlflow_client(cfg)
    experiment_id = client.get_run(first.run_id).info.experiment_id
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_tags = {**stale.owner_tags(), "tfmlops.owner.pid": str(gone.pid), TAG_STAGE: "prepare"}
    orphans = [client.create_run(experiment_id, tags=dead_tags).info.run_id for _ in range(5)]
    with tracking.stage_run(cfg, "prepare", tmp_path / "out"):
        pass
    assert {status(client, r) for r in orphans} == {"KILLED"}


def test_another_hosts_run_is_closed_once_its_heartbeat_stopped(tmp_path, make_cfg,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    # The second closer must come within STALE of the first (a loaded 2-core machine took
    # over 1 s to open and end a run), the third after it: a wide window on both sides.
    monkeypatch.setenv(heartbeat.STALE_AFTER_ENV, str(STALE))
    cfg = make_cfg()
    with tracking.stage_run(cfg, "prepare", tmp_path / "out") as first:
        pass
    client = mlflow_client(cfg)
    experiment_id = client.get_run(first.run_id).info.experiment_id
    dead, live, outage = (forge_remote_run(client, experiment_id, "prepare") for _ in range(3))
    trial_tags = {**client.get_run(dead).data.tags, "mlflow.parentRunId": dead}
    del trial_tags[HEARTBEAT_TAG]  # a child run has no heartbeat: it goes with its parent
    child = client.create_run(experiment_id, tags=trial_tags).info.run_id
    beating = heartbeat.Heartbeat(live, attempts=2, interval=0.3).start()  # its owner lives
    back = None
    try:
        with tracking.stage_run(cfg, "prepare", tmp_path / "out"):  # sees each heartbeat once
            pass
        time.sleep(1.5)
        with tracking.stage_run(cfg, "prepare", tmp_path / "out"):  # silent, not for long
            pass
        assert {status(client, r) for r in (dead, live, outage, child)} == {"RUNNING"}
        # the outage ends: its owner reaches the store again and beats
        back = heartbeat.Heartbeat(outage, attempts=2, interval=0.3).start()
        time.sleep(STALE - 1.0)  # with the 1.5 s above: past STALE since the first closer
        with tracking.stage_run(cfg, "prepare", tmp_path / "out") as closer:
            pass
    finally:
        beating.stop()
        if back is not None:
            back.stop()
    assert status(client, dead) == "KILLED"
    assert status(client, child) == "KILLED"
    reason = client.get_run(dead).data.tags[stale.KILLED_TAG]
    assert reason == (f"heartbeat unchanged for over {STALE} s; closed by run {closer.run_id} "
                      "of prepare")
    assert status(client, live) == "RUNNING"
    assert status(client, outage) == "RUNNING"
    assert int(client.get_run(live).data.tags[HEARTBEAT_TAG]) > 3


STALE = 8


def test_a_stage_run_renews_its_heartbeat_while_it_is_open(tmp_path, make_cfg, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg()
    env = {**child_env(), heartbeat.HEARTBEAT_ENV: "0.2"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "prepare"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        run_id = json.loads(line)["run"]
        client = mlflow_client(cfg)
        beats = []
        for _ in range(50):
            beats.append(int(client.get_run(run_id).data.tags[HEARTBEAT_TAG]))
            if len(set(beats)) >= 3:
                break
            time.sleep(0.2)
        assert len(set(beats)) >= 3 and beats == sorted(beats), beats
    finally:
        proc.kill()
        proc.wait()


def test_the_threshold_outlasts_the_stores_retry_window(monkeypatch):
    """A live owner that cannot reach the store retries a beat for the whole window
    before its next one: its run is not judged before that."""
    monkeypatch.delenv(heartbeat.STALE_AFTER_ENV, raising=False)
    monkeypatch.delenv(heartbeat.HEARTBEAT_ENV, raising=False)
    for attempts in (1, 4, 21):
        window = retry_window_s(attempts, attempt_bound_s())
        assert heartbeat.stale_after_s(attempts) > window + heartbeat.HEARTBEAT_S
    assert retry_window_s(4, 10.0) == 4 * 10.0 + 0.5 + 1 + 2
