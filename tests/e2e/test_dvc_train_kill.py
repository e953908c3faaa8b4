"""kill -9 of `dvc repro` itself during `train`, then `dvc repro` again (issue 14, item 4).

The process group of `dvc repro` (DVC and the `tfmlops train` it started) is
SIGKILLed once the backup in `paths.backup` holds a finished epoch. The next
`dvc repro` resumes after that epoch (the persisted backup), and dvc.lock
records `train` only once a run of it has finished.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import VENV_BIN, child_env, dvc, relative_tiny_params, scratch_repo
from tfmlops.artifacts import MODEL_FILE

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
EPOCHS = 12
# As small as it gets: 120 synthetic 16x16 images in 2 classes, float32, no tracking; an
# epoch still takes about a second here, so the kill has 11 epochs of window after the
# first backup (a machine at half speed, or a test process starved for seconds, still
# kills a running train).
PARAMS = {"data": {"builtin": "synthetic",
                   "synthetic": {"count": 120, "image_size": 16, "classes": 2}},
          "tune": {"enabled": False},
          "train": {"epochs": EPOCHS, "batch_size": 16, "precision": "float32"},
          "tracking": {"enabled": False}}


def lock_stages(repo: Path) -> dict:
    lock = repo / "dvc.lock"
    return yaml.safe_load(lock.read_text())["stages"] if lock.is_file() else {}


def wait_group_gone(pgid: int, timeout_s: float = 120) -> None:
    """Until no process of the group runs any more (gone, or a zombie nobody reaped yet):
    the killed stage cannot write into its backup after that."""
    import psutil

    def alive() -> list[int]:
        found = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    found.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    deadline = time.monotonic() + timeout_s
    while alive():
        assert time.monotonic() < deadline, f"process group {pgid} still running: {alive()}"
        time.sleep(0.05)


def test_kill_9_of_dvc_repro_during_train_resumes_and_locks_only_success(tmp_path):
    from tfmlops.model.backup import finished_epochs, history_rows

    params = relative_tiny_params(**PARAMS)
    repo = scratch_repo(tmp_path / "repo", params)
    backup = repo / params["paths"]["backup"]
    log = (tmp_path / "repro.log").open("w")
    proc = subprocess.Popen([str(VENV_BIN / "dvc"), "repro", "train"], cwd=repo,
                            env={**child_env(), "DVC_NO_ANALYTICS": "1"},
                            stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: DVC and its stage
    try:
        deadline = time.monotonic() + 300
        while finished_epochs(backup) < 1:
            assert proc.poll() is None, ("dvc repro ended before train's first backup:\n"
                                         + (tmp_path / "repro.log").read_text()[-3000:])
            assert time.monotonic() < deadline, "no finished epoch after 300 s"
            time.sleep(0.05)
        assert "train" not in lock_stages(repo)  # running: nothing recorded yet
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    wait_group_gone(proc.pid)  # the killed stage process is reaped by init, not by the test
    killed_after = finished_epochs(backup)
    assert 1 <= killed_after < EPOCHS
    assert "train" not in lock_stages(repo)  # the kill left nothing recorded as done
    assert not (repo / params["paths"]["train"]).exists()  # no half-written model either
    assert {"materialize", "prepare"} <= set(lock_stages(repo))

    again = dvc("repro", "train", cwd=repo)
    assert "Running stage 'train'" in again.stdout
    assert "Running stage 'prepare'" not in again.stdout  # finished stages stay done
    assert f"resuming after epoch {killed_after} of {EPOCHS}" in again.stdout + again.stderr
    report = json.loads((repo / params["paths"]["reports"] / "train.json").read_text())
    assert report["resumed_after_epoch"] == killed_after
    assert report["epochs_run"] == EPOCHS
    curve = (repo / params["paths"]["reports"] / "train_history.csv").read_text().splitlines()
    assert [int(line.split(",")[0]) for line in curve[1:]] == list(range(1, EPOCHS + 1))
    assert history_rows(backup) == []  # emptied after success
    lock = lock_stages(repo)
    assert "train" in lock
    model = repo / params["paths"]["train"] / MODEL_FILE
    assert model.is_file()
    assert dvc("status", "train", cwd=repo).stdout.strip().endswith("up to date.")
