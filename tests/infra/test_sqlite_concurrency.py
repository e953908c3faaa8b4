"""Eight processes log to the default SQLite store at once, starting from no store.

What it guards: a fresh SQLite store is created by whichever process touches it
first (schema migrations); without tracking.use_uri's file lock, seven of eight
racing processes died here ("Online migration expected to match one row").
After that, SQLite's busy timeout (20 s, set by MLflow) serialises the writes:
no "database is locked", no lost row.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env, mlflow_client

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

WRITERS = 8
STEPS = 25
WRITER = Path(__file__).with_name("concurrent_writer.py")


def test_eight_processes_log_to_one_fresh_sqlite_store(tmp_path, make_cfg):
    cfg = make_cfg()
    store = Path(cfg.tracking.uri[len("sqlite:///"):])
    assert not store.exists()
    start = tmp_path / "start"
    env = {**child_env(), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)  # MLflow adds test-only checks when it sees it
    procs = [subprocess.Popen([sys.executable, str(WRITER), str(tmp_path / "params.yaml"), str(i),
                               str(STEPS), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=tmp_path)
             for i in range(WRITERS)]
    try:
        for proc in procs:  # every writer has MLflow loaded: they start together
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        start.touch()
        results = [proc.communicate(timeout=500) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()

    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert "database is locked" not in err and "MLflow logging problem" not in err, err[-3000:]
        assert out.strip().endswith("errors=0 queued=0")

    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'concurrency'")
    assert len(runs) == WRITERS and {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.params["writer"] for r in runs) == [str(i) for i in range(WRITERS)]
    for run in runs:
        history = client.get_metric_history(run.info.run_id, "value")
        assert sorted(m.step for m in history) == list(range(STEPS))  # no row lost
    assert not (Path(cfg.paths.reports) / "outbox").exists()

