"""`tfmlops prepare` hands its finished MLflow run over and exits (issue 26: tracking
that does not wait; tracking.wait: false). Real processes, real MLflow on a temp SQLite
store. Before it exits, the run is in the outbox (issue 47, M7): a sidecar killed with
its container or CI step the moment prepare exits loses nothing, `tfmlops sync` or the
next stage delivers the run, once. Held by SIGSTOP before it delivers, the sidecar keeps
a reader of the run file (a later stage's lineage) waiting; once it goes on, the run is
FINISHED with everything prepare logged, its log is in reports/prepare/tracking.log, the
hard links it sent from are gone and nothing is sent twice; it never holds the stage's
output pipes (a `| tee` or a CI runner would wait). A rerun while that sidecar still
delivers does not wait for it (issue 50); its own sidecar delivers after it, in order."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import VENV_BIN, child_env, mlflow_client, stage_runs
from images import photo_folder
from tfmlops import tracking
from tfmlops.artifacts import DETACHED_LOG, RUN_FILE, run_dir
from tfmlops.tracking.lineage import read_run_file, wait_delivered

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _held_prepare(tmp_path: Path, make_cfg):
    """`tfmlops prepare` with its sidecar stopped where it would end the run: the exited
    stage's result, its log, the stopped sidecar's pid and the private temp folder."""
    photos = tmp_path / "photos"
    photo_folder(photos, per_class=4, classes=2)
    cfg = make_cfg(data={"image_dir": str(photos), "channels": 3, "image_size": 16})
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**child_env(), "TFMLOPS_FAULT": "sidecar.end", "TFMLOPS_FAULT_SIGNAL": "SIGSTOP",
           "TMPDIR": str(temp)}
    # Pipes, as `tfmlops prepare 2>&1 | tee` or a CI runner reads it: the sidecar, stopped
    # before it delivers, must not keep them open (it writes to tracking.log instead).
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    pid = int(re.search(r"background process \(pid (\d+)", text).group(1))
    sidecar = psutil.Process(pid)
    # It stops itself once it has the end. It imports MLflow first, at nice 10: on a
    # busy 2-core machine that took 10-15 s (10 s here used to fail there).
    deadline = time.monotonic() + 120
    while sidecar.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.05)
    if sidecar.status() != psutil.STATUS_STOPPED:
        sidecar.kill()  # not left behind, stopped later at its fault point
        pytest.fail(f"the sidecar did not reach its stop point in 120 s ({sidecar.status()})")
    return cfg, sidecar, temp, text


def _outbox(cfg) -> list[Path]:
    folder = Path(cfg.paths.reports) / "outbox"
    return sorted(p for p in folder.iterdir() if p.name != "heartbeats_seen.json") \
        if folder.is_dir() else []


def _delivered_once(cfg, tmp_path):
    """The one prepare run, checked whole: FINISHED, named by the run file, with its
    params, metrics (each sent once), files and figure; nothing left in the outbox."""
    (run,) = stage_runs(cfg, "prepare")
    assert run.info.status == "FINISHED" and run.data.params
    assert run.data.metrics["images_good"] == 8
    client = mlflow_client(cfg)
    assert len(client.get_metric_history(run.info.run_id, "images_good")) == 1
    assert read_run_file(run_dir(cfg, "prepare"))["run_id"] == run.info.run_id
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "prepared")}
    assert logged == {"prepared/manifest.json", "prepared/quarantine.json", "prepared/stats.json"}
    manifest = client.download_artifacts(run.info.run_id, "prepared/manifest.json", str(tmp_path))
    assert Path(manifest).read_bytes() == (Path(cfg.paths.prepared) / "manifest.json").read_bytes()
    figures = {Path(a.path).suffix for a in client.list_artifacts(run.info.run_id, "data_profile")}
    assert figures == {".json", ".png"}  # the profile and its figure, drawn by the delivery
    assert _outbox(cfg) == []  # sent, so removed: hard links included
    return run


def test_prepare_exits_before_its_run_is_stored_and_readers_wait_for_it(tmp_path, make_cfg):
    cfg, sidecar, temp, text = _held_prepare(tmp_path, make_cfg)
    folder = run_dir(cfg, "prepare")
    assert (Path(cfg.paths.prepared) / "manifest.json").is_file()  # the stage's work is done
    assert [p.suffix for p in _outbox(cfg)] == [".files", ".jsonl"]  # the run, handed over
    assert json.loads((folder / RUN_FILE).read_text())["run_id"] is None  # waits for its id
    assert not wait_delivered(folder, timeout_s=0.5)  # the sidecar holds its lock
    assert stage_runs(cfg, "prepare") == []
    os.kill(sidecar.pid, signal.SIGCONT)
    run_file = read_run_file(folder)  # what a later stage's lineage does: waits, then reads
    assert not sidecar.is_running() or sidecar.status() == psutil.STATUS_ZOMBIE
    run = _delivered_once(cfg, tmp_path)
    assert run_file["run_id"] == run.info.run_id and run_file["data_version"]
    delivered = (folder / DETACHED_LOG).read_text()
    assert f"MLflow run {run.info.run_name}" in delivered, delivered
    assert list(temp.iterdir()) == []  # nothing in the system's temp folder
    assert "Traceback" not in text and "WARNING" not in delivered
    # Delivered, so removed: a sync (as a later stage's run does first) sends nothing again.
    assert tracking.sync(cfg)["calls"] == 0
    _delivered_once(cfg, tmp_path)


def _killed_as_prepare_exits(tmp_path: Path, cfg) -> None:
    """`tfmlops prepare`, its sidecar and anything it started killed the moment prepare
    exits, as a container runtime or a CI runner does with what a step leaves behind."""
    log = tmp_path / "prepare.log"
    with log.open("w") as out:
        stage = subprocess.Popen([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path,
                                 env=child_env(), stdout=out, stderr=out, start_new_session=True)
        assert stage.wait(timeout=240) == 0, log.read_text()[-3000:]
    sidecar = psutil.Process(int(re.search(r"background process \(pid (\d+)",
                                           log.read_text()).group(1)))
    # Its whole tree (a killpg would miss it before its setsid): nothing outlives the step.
    for proc in [sidecar, *sidecar.children(recursive=True)]:
        proc.kill()
    sidecar.wait(10)
    # Killed before it could deliver (it imports MLflow first, seconds): still queued.
    assert any(p.suffix == ".jsonl" for p in _outbox(cfg)), _outbox(cfg)


def test_a_run_whose_sidecar_is_killed_as_prepare_exits_is_delivered_once_by_sync(
        tmp_path, make_cfg):
    photos = tmp_path / "photos"
    photo_folder(photos, per_class=4, classes=2)
    cfg = make_cfg(data={"image_dir": str(photos), "channels": 3, "image_size": 16})
    _killed_as_prepare_exits(tmp_path, cfg)
    assert stage_runs(cfg, "prepare") == []
    assert tracking.sync(cfg)["rejected"] == 0
    _delivered_once(cfg, tmp_path)
    assert tracking.sync(cfg) == {"files": 0, "calls": 0, "rejected": 0, "other_store": 0}
    _delivered_once(cfg, tmp_path)


def test_a_rerun_does_not_wait_for_the_previous_delivery_and_loses_nothing_when_it_is_killed(
        tmp_path, make_cfg):
    """issue 50: a prepare rerun while the previous run's sidecar still delivers (here:
    stopped, holding the delivery lock) does its work and hands its run over without
    waiting; its sidecar waits for its turn, and readers wait for it too. The previous
    sidecar killed, nothing is lost: the rerun's sidecar delivers both runs, the earlier
    first, each once, and the run file names the later run."""
    cfg, first_sidecar, _, _ = _held_prepare(tmp_path, make_cfg)
    try:
        _rerun_while_held(cfg, first_sidecar, tmp_path)
    finally:  # not left stopped behind a failed check
        with contextlib.suppress(psutil.NoSuchProcess):
            first_sidecar.kill()


def _rerun_while_held(cfg, first_sidecar: psutil.Process, tmp_path: Path) -> None:
    folder = run_dir(cfg, "prepare")
    first_pending = json.loads((folder / RUN_FILE).read_text())["pending"]
    # With the lock taken at the start (waiting for the stopped sidecar) this never exits.
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    second_sidecar = psutil.Process(int(re.search(r"background process \(pid (\d+)",
                                                  proc.stderr).group(1)))
    os.kill(second_sidecar.pid, signal.SIGSTOP)  # queued: it cannot have the lock yet
    try:
        assert json.loads((folder / RUN_FILE).read_text())["pending"] != first_pending
        first_sidecar.kill()
        first_sidecar.wait(10)
        # The lock is free now, but a run still waits for its turn: a reader waits for it.
        assert not wait_delivered(folder, timeout_s=1)
        assert stage_runs(cfg, "prepare") == [] and len(_outbox(cfg)) == 4  # two runs, their files
    finally:
        os.kill(second_sidecar.pid, signal.SIGCONT)
    assert wait_delivered(folder, timeout_s=120)
    runs = stage_runs(cfg, "prepare")
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"], runs
    first, second = sorted(runs, key=lambda r: r.info.start_time)
    assert first.info.end_time < second.info.end_time  # delivered in the order they ran
    client = mlflow_client(cfg)
    for run in (first, second):
        assert run.data.metrics["images_good"] == 8
        assert len(client.get_metric_history(run.info.run_id, "images_good")) == 1
    # The run file names the later run: the earlier one, delivered after, does not take it back.
    assert read_run_file(folder)["run_id"] == second.info.run_id
    assert _outbox(cfg) == []


def test_with_tracking_wait_the_run_is_stored_when_prepare_exits(tmp_path, make_cfg):
    """docs/stages.md: `tracking.wait: true` makes prepare wait. When it exits its run is in the
    store, whole; no background process was started and nothing is left queued."""
    photos = tmp_path / "photos"
    photo_folder(photos, per_class=4, classes=2)
    cfg = make_cfg(data={"image_dir": str(photos), "channels": 3, "image_size": 16},
                   tracking={"wait": True})
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "background process" not in text
    _delivered_once(cfg, tmp_path)  # read at once: nothing to wait for
