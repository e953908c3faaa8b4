"""SIGTERM (a CI cancel, `timeout`, a pod deleted) of a stage: its MLflow run ends
KILLED, not RUNNING; it exits 143 with one line; no output is half swapped in, and no
child process (prepare's pool, train's tracking sidecar) is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
from test_prepare_kill import TEMP_MARKS, _tagged
from test_prepare_trust import age, prepared_bytes

from conftest import VENV_BIN, child_env, mlflow_client, stage_runs
from images import photo_folder
from tfmlops.artifacts import MODEL_FILE

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _cfg(make_cfg, photos: Path, image_size: int):
    return make_cfg(data={"image_dir": str(photos), "channels": 3, "image_size": image_size,
                          "workers": 2, "split": {"val": 0.2, "test": 0.2}})


def _prepared_then_changed(tmp_path, make_cfg):
    """(cfg, its prepared bytes) after one prepare; params.yaml then asks for another
    image size, so the next prepare makes a new output."""
    from tfmlops.stages import prepare

    photos = tmp_path / "photos"
    photo_folder(photos, per_class=4, classes=2)
    age(photos)
    cfg = _cfg(make_cfg, photos, 16)
    prepare.run(cfg)
    before = prepared_bytes(cfg)
    _cfg(make_cfg, photos, 20)
    return cfg, before


def test_sigterm_inside_prepares_run_ends_it_killed_and_keeps_the_previous_output(
        tmp_path, make_cfg):
    """SIGTERM between swap-in's two renames (the last moment inside prepare's run):
    exit 143 in one line, the run KILLED, data/prepared still the previous output."""

    cfg, before = _prepared_then_changed(tmp_path, make_cfg)
    tag = uuid.uuid4().hex
    env = {**child_env(), "TFMLOPS_FAULT": "swap.old", "TFMLOPS_FAULT_SIGNAL": "SIGTERM",
           "TFMLOPS_KILL_TEST": tag}
    log = tmp_path / "stopped.log"  # a file, not a pipe: a surviving worker would hold it
    with log.open("w") as out:
        proc = subprocess.run([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path, env=env,
                              stdout=out, stderr=out, timeout=300)
    text = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    last = text.strip().splitlines()[-1]
    assert "prepare: stopped by SIGTERM" in last and "KILLED" in last, last
    assert [r.info.status for r in stage_runs(cfg, "prepare")] == ["KILLED", "FINISHED"]
    assert prepared_bytes(cfg) == before  # put back, not half swapped
    left = [str(p.relative_to(tmp_path)) for p in (tmp_path / "data").rglob("*")
            if any(mark in p.name for mark in TEMP_MARKS)]
    assert left == []
    assert not _tagged(tag, wait=10), "a pool worker outlived the stopped prepare"


def _group(pgid: int) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def test_sigterm_to_train_and_its_sidecar_ends_the_run_killed(tmp_path, digits_workdir):
    """`tfmlops train` in its own process group, SIGTERM to the whole group after an
    epoch (as a CI cancel sends it): the sidecar outlives the signal long enough to end
    the run KILLED, then nothing of the group is left and no model is swapped in."""
    from tfmlops.model.backup import finished_epochs

    cfg = digits_workdir(train={"use_tuned": False, "epochs": 40})
    log = tmp_path / "train.log"
    # Held at the second epoch's end (the first one's backup written), then signalled: a
    # train that finishes its 40 epochs before a starved poller sees one cannot slip by.
    env = {**child_env(), "TFMLOPS_FAULT": "train.epoch_end@2", "TFMLOPS_FAULT_SIGNAL": "SIGSTOP"}
    with log.open("w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "tfmlops"), "train"], cwd=tmp_path,
                                env=env, stdout=out, stderr=out, start_new_session=True)
        try:
            deadline = time.monotonic() + 400
            while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "train did not reach its second epoch's end"
                time.sleep(0.1)
            assert finished_epochs(cfg.paths.backup) == 1
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "train: stopped by SIGTERM" in text.strip().splitlines()[-1], text[-2000:]
    deadline = time.monotonic() + 30
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group(proc.pid) == [], "a process of the stopped train is left (its sidecar?)"
    (run,) = stage_runs(cfg, "train")
    assert run.info.status == "KILLED"
    assert not (Path(cfg.paths.train) / MODEL_FILE).exists()
    assert mlflow_client(cfg).get_run(run.info.run_id).info.end_time is not None


def _sigint_as_in_a_terminal() -> None:
    """In the child, before exec: SIGINT at its default, as a terminal's foreground job has
    it. A suite started in the background of a shell without job control (`cmd &` in a
    script, `bash -c '... &'`) has SIGINT ignored; a child inherits that and Python keeps
    it, so prepare would let the Ctrl-C pass and finish (exit 0, its whole output)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_to_prepares_process_group_exits_130_and_keeps_the_previous_output(
        tmp_path, make_cfg):
    """Ctrl-C in a terminal: SIGINT to the whole foreground group (prepare, its pool, any
    sidecar), here while prepare is held between swap-in's renames. Exit 130 with one
    line, the run KILLED, the previous output in place, no temp file and no process left."""

    cfg, before = _prepared_then_changed(tmp_path, make_cfg)
    env = {**child_env(), "TFMLOPS_FAULT": "swap.old", "TFMLOPS_FAULT_SIGNAL": "SIGSTOP"}
    log = tmp_path / "interrupted.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "tfmlops"), "prepare"], cwd=tmp_path, env=env,
                                stdout=out, stderr=out, start_new_session=True,
                                preexec_fn=_sigint_as_in_a_terminal)
        try:
            deadline = time.monotonic() + 240
            while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
            os.killpg(proc.pid, signal.SIGCONT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 128 + signal.SIGINT, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    last = text.strip().splitlines()[-1]
    assert "prepare: stopped by an interrupt (Ctrl-C)" in last and "KILLED" in last, last
    assert prepared_bytes(cfg) == before
    left = [str(p.relative_to(tmp_path)) for p in (tmp_path / "data").rglob("*")
            if any(mark in p.name for mark in TEMP_MARKS)]
    assert left == []
    assert _group(proc.pid) == []
    deadline = time.monotonic() + 60  # the run is ended by the sidecar, which may lag
    while [r.info.status for r in stage_runs(cfg, "prepare")] != ["KILLED", "FINISHED"]:
        assert time.monotonic() < deadline, [r.info.status for r in stage_runs(cfg, "prepare")]
        time.sleep(0.5)
