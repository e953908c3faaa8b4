"""Issue 14.4: a SIGKILLed stage leaves its MLflow run RUNNING; the next run of that
stage (same repo, same store) marks it KILLED once its owner process is provably gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import child_env, mlflow_client
from tfmlops import tracking
from tfmlops.tracking import stale

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
