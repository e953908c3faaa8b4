"""`tfmlops train` on two real worker processes (TF_CONFIG, 127.0.0.1, free ports).

MultiWorkerMirroredStrategy with tf_keras fit (stages/train/fit.py): one
MLflow run, one model written by the chief, non-chief temp folders removed,
and a worker killed mid-training resumes from the BackupAndRestore state.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import VENV_BIN, child_env, free_port, stage_runs
from tfmlops.artifacts import MODEL_FILE

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRATCH = "worker-tmp"
NO_TUNE = {"use_tuned": False, "overrides": {"optimizer.learning_rate": 0.01}}


class Workers:
    """`tfmlops train` once per task of a fresh 2-worker TF_CONFIG; logs go to files."""

    def __init__(self, workdir: Path, count: int = 2, attempt: str = "run"):
        self.workdir = workdir
        # TMPDIR, where a non-chief makes its own folder (a SIGKILLed worker cannot remove it)
        self.scratch = workdir / SCRATCH / attempt
        self.scratch.mkdir(parents=True)
        cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(count)]}
        self.logs = [workdir / f"{attempt}-worker{i}.log" for i in range(count)]
        self.procs = []
        for i, log in enumerate(self.logs):
            env = {**child_env(), "TMPDIR": str(self.scratch), "PYTHONUNBUFFERED": "1",
                   "TF_CONFIG": json.dumps({"cluster": cluster,
                                            "task": {"type": "worker", "index": i}})}
            with log.open("w") as out:  # a file, not a pipe: a full pipe would block a worker
                self.procs.append(subprocess.Popen([str(VENV_BIN / "tfmlops"), "train"],
                                                   cwd=workdir, env=env, stdout=out,
                                                   stderr=subprocess.STDOUT))

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        return [p.returncode for p in self.procs]

    def output(self, i: int) -> str:
        return self.logs[i].read_text()

    def tails(self) -> str:
        return "\n".join(f"--- worker {i}:\n{self.output(i)[-3000:]}" for i in range(len(self.logs)))

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def history_epochs(cfg) -> list[int]:
    with open(Path(cfg.paths.reports) / "train_history.csv", newline="") as fh:
        return [int(row["epoch"]) for row in csv.DictReader(fh)]


def assert_no_worker_leftovers(workdir: Path, workers: Workers) -> None:
    # tf_keras' per-worker checkpoint folders in the outputs, and the non-chief's own folder
    assert not [p for p in workdir.rglob("workertemp_*") if workdir / SCRATCH not in p.parents]
    assert list(workers.scratch.iterdir()) == []


@pytest.mark.timeout(900)
def test_two_workers_train_one_model_under_one_mlflow_run(digits_workdir, tmp_path):
    from tfmlops.data import pipeline
    from tfmlops.model.trained import load_keras3, trained_model_path

    cfg = digits_workdir(train={**NO_TUNE, "epochs": 2})
    workers = Workers(tmp_path)
    try:
        codes = workers.wait(timeout=840)  # generous: a loaded machine runs at half speed
    finally:
        workers.kill()
    assert codes == [0, 0], workers.tails()

    for i in range(2):  # each worker fed the pipeline's dataset, sharded by element
        assert f"worker:{i} of 2 workers, 2 replicas, global batch 64, auto-shard DATA" in \
            workers.output(i)
    chief, other = workers.output(0), workers.output(1)
    assert "test accuracy" in chief and "test accuracy" not in other
    assert json.loads(other.strip().splitlines()[-1]) == {"task": "worker:1", "epochs_run_now": 2}

    (run,) = stage_runs(cfg, "train")
    assert run.info.status == "FINISHED"
    assert run.data.tags["tfmlops.strategy"] == "multi_worker"
    assert run.data.params["resolved.workers"] == "2"
    # tf.distribute.MultiWorkerMirroredStrategy is an alias of this class
    assert run.data.params["resolved.strategy_class"] == "CollectiveAllReduceStrategy"
    assert run.data.params["resolved.global_batch_size"] == "64"
    assert set(run.data.metrics) >= {"test_accuracy", "val_loss", "loss"}

    saved = list(tmp_path.rglob("*.keras"))  # written once, logged to MLflow once
    logged = [p for p in saved if "mlartifacts" in p.parts]
    assert [p for p in saved if p not in logged] == [trained_model_path(cfg)]
    assert len(logged) == 1
    assert_no_worker_leftovers(tmp_path, workers)
    assert list(Path(cfg.paths.backup).iterdir()) == []  # emptied after success
    assert history_epochs(cfg) == [1, 2]

    prepared = pipeline.load_prepared(cfg)
    x, y = pipeline.arrays(cfg, prepared, "test")
    model = load_keras3(trained_model_path(cfg))
    accuracy = float(np.mean(model.predict(x, verbose=0).argmax(-1) == y))
    assert accuracy > 0.3, accuracy  # 10 classes: chance is 0.1
    reported = json.loads((Path(cfg.paths.reports) / "train.json").read_text())
    assert reported["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert reported["replicas"] == 2


@pytest.mark.timeout(1200)
def test_a_killed_worker_and_a_restart_resume_from_the_backup(digits_workdir, tmp_path):
    from tfmlops.model.backup import chief_finished_epochs

    epochs = 6
    cfg = digits_workdir(train={**NO_TUNE, "epochs": epochs}, tracking={"enabled": False})
    backup = Path(cfg.paths.backup)
    # One budget for the whole test, inside its timeout: the waits below draw on it, so
    # however slow one step is, together they never pass the timeout (a loaded machine).
    deadline = time.monotonic() + 1140
    first = Workers(tmp_path, attempt="killed")
    try:
        while chief_finished_epochs(backup) < 1:
            assert all(p.poll() is None for p in first.procs), first.tails()
            assert time.monotonic() < deadline, "no backup in the test's time\n" + first.tails()
            time.sleep(0.05)
        first.procs[1].send_signal(signal.SIGKILL)  # the non-chief dies mid-training
        # The chief's collectives fail once the dead peer misses its heartbeats.
        chief_code = first.procs[0].wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        first.kill()
    assert chief_code != 0
    killed_after = chief_finished_epochs(backup)
    assert 1 <= killed_after < epochs, first.tails()
    assert not Path(cfg.paths.train).exists()  # nothing half-written, nothing "done"

    second = Workers(tmp_path, attempt="restart")
    try:
        codes = second.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        second.kill()
    assert codes == [0, 0], second.tails()
    assert f"resuming after epoch {killed_after} of {epochs}" in second.output(0)
    assert history_epochs(cfg) == list(range(1, epochs + 1))  # no epoch run twice
    metrics = json.loads((Path(cfg.paths.reports) / "train.json").read_text())
    assert metrics["resumed_after_epoch"] == killed_after
    assert metrics["epochs_run"] == epochs
    assert Path(cfg.paths.train, MODEL_FILE).is_file()
    assert list(backup.iterdir()) == []
    assert_no_worker_leftovers(tmp_path, second)
