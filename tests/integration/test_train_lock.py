"""Two `tfmlops train` at once on one repo, outside DVC: the harness's output lock
(harness.py) makes them take turns, and the folder swapped in is one run's.

The first is held inside its run (TFMLOPS_FAULT=train.running, SIGSTOP) while it holds
the lock; the second says in one line that it waits, then trains once the first is done."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, child_env, stage_runs
from tfmlops.artifacts import MODEL_FILE, PRECISION, RESOLVED_PARAMS, RUN_FILE, TUNE_MERGE

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _train(cwd: Path, log: Path, **env) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen([str(VENV_BIN / "tfmlops"), "train"], cwd=cwd, stdout=out,
                            stderr=out, env={**child_env(), **env})


def test_two_trains_take_turns_and_the_output_is_one_runs(tmp_path, digits_workdir):
    cfg = digits_workdir(train={"use_tuned": False, "epochs": 1})
    first = _train(tmp_path, tmp_path / "first.log", TFMLOPS_FAULT="train.running",
                   TFMLOPS_FAULT_SIGNAL="SIGSTOP")
    second = None
    try:
        deadline = time.monotonic() + 300
        while not [r for r in stage_runs(cfg, "train") if r.info.status == "RUNNING"]:
            assert first.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.5)
        waited = tmp_path / "second.log"
        second = _train(tmp_path, waited)
        while "waiting for it to finish" not in waited.read_text():
            assert second.poll() is None and time.monotonic() < deadline, \
                waited.read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(2)  # it stays blocked: one run in the store, no output swapped in
        assert second.poll() is None
        assert len(stage_runs(cfg, "train")) == 1
        assert not Path(cfg.paths.train).exists()
        waiting = [ln for ln in waited.read_text().splitlines() if "waiting" in ln]
        assert len(waiting) == 1 and "another `tfmlops train` is writing" in waiting[0], waiting
        assert str(Path(".tfmlops", "locks", "train.lock")) in waiting[0], waiting

        first.send_signal(signal.SIGCONT)
        assert first.wait(300) == 0, (tmp_path / "first.log").read_text()[-2000:]
        assert second.wait(300) == 0, waited.read_text()[-2000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    runs = sorted(stage_runs(cfg, "train"), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    assert runs[0].info.end_time <= runs[1].info.start_time  # one after the other
    # paths.train is the second run's, whole: its run file, and the metrics it reported
    final = Path(cfg.paths.train)
    assert json.loads((final / RUN_FILE).read_text())["run_id"] == runs[1].info.run_id
    reported = json.loads((Path(cfg.paths.reports) / "train.json").read_text())
    assert reported["test_accuracy"] == pytest.approx(runs[1].data.metrics["test_accuracy"])
    assert sorted(p.name for p in final.iterdir()) == sorted(
        [MODEL_FILE, RUN_FILE, RESOLVED_PARAMS, TUNE_MERGE, PRECISION,
         "classification_report.json", "confusion_matrix.png", "training_curves.png"])
    # no staging folder or lock file left beside it (the lock lives in .tfmlops/locks)
    assert not [p for p in final.parent.iterdir() if p.name.startswith(f".{final.name}")]
