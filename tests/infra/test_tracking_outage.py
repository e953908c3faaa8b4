"""Tracking outages: a server away at the start stops a stage before any work; a
server that dies mid-run costs nothing but an outbox that `tfmlops sync` replays.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
from live_services import MlflowServer

from conftest import VENV_BIN, child_env, free_port, mlflow_client, run_cli
from tfmlops import tracking
from tfmlops.errors import TrackingUnavailable


def test_unreachable_server_stops_the_stage_before_any_work(tmp_path, make_cfg):
    cfg = make_cfg()
    run_cli("materialize", cwd=tmp_path)
    uri = f"http://127.0.0.1:{free_port()}"  # bound once, released: nothing listens
    proc = run_cli("prepare", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri}, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()  # progress lines of the image scan, then the error
    (line,) = [x for x in lines if "error" in x.lower()]
    assert line == lines[-1] and line.startswith("tfmlops prepare: error: MLflow tracking server ")
    assert uri in line and "unreachable" in line
    assert not Path(cfg.paths.prepared).exists()
    assert not list(tmp_path.rglob("*.tfrecord"))
    assert not (Path(cfg.paths.reports) / "prepare.json").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_server_killed_mid_train_then_sync_uploads_what_was_missed(tmp_path, digits_workdir):
    import mlflow

    cfg = digits_workdir(train={"use_tuned": False, "epochs": 3})
    server = MlflowServer(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "server-artifacts",
                          tmp_path).start()
    env = {**child_env(),
           "MLFLOW_TRACKING_URI": server.url}
    stage = None
    out, err = tmp_path / "train.out", tmp_path / "train.err"  # files: a full pipe would block it
    try:
        client = mlflow.MlflowClient(server.url)
        with out.open("w") as fout, err.open("w") as ferr:
            stage = subprocess.Popen([str(VENV_BIN / "tfmlops"), "train"], cwd=tmp_path, env=env,
                                     stdout=fout, stderr=ferr)
        run_id = _wait_for_open_run(client, stage, "train", err)
        server.kill()  # a crash while the stage trains
        stage.wait(timeout=600)
        out, err = out.read_text(), err.read_text()
        assert stage.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    finally:
        server.kill()
        if stage is not None and stage.poll() is None:
            stage.kill()

    # Training completed and saved everything locally.
    assert (Path(cfg.paths.train) / "model.keras").is_file()
    report = json.loads((Path(cfg.paths.reports) / "train.json").read_text())
    assert "test_accuracy" in report
    assert "MLflow logging problem (train)" in err and "tfmlops sync" in err

    outbox = Path(cfg.paths.reports) / "outbox"
    (queue,) = outbox.glob("*.jsonl")
    entries = [json.loads(line) for line in queue.read_text().splitlines()]
    assert {e["run_id"] for e in entries} == {run_id}
    ops = [e["op"] for e in entries]
    assert ops[-1] == "end" and entries[-1]["payload"]["status"] == "FINISHED"
    assert "metrics" in ops and "artifact" in ops
    kept = [Path(e["payload"]["path"]) for e in entries if e["op"] == "artifact"]
    assert all(p.exists() and outbox in p.parents for p in kept)  # copies, safe from later moves

    server.start()  # the same store, the same port
    client = mlflow.MlflowClient(server.url)
    before = client.get_run(run_id)
    assert before.info.status == "RUNNING" and "test_accuracy" not in before.data.metrics
    try:
        synced = run_cli("sync", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": server.url})
        assert "View run train at" in synced.stdout  # MLflow's link, printed on the replayed end
        assert json.loads(synced.stdout.splitlines()[-1]) == {"files": 1, "calls": len(entries)}
        after = client.get_run(run_id)
        assert after.info.status == "FINISHED"
        assert after.data.metrics["test_accuracy"] == pytest.approx(report["test_accuracy"])
        epochs = client.get_metric_history(run_id, "val_accuracy")
        assert sorted(m.step for m in epochs) == [1, 2, 3]
        assert {"train", "reports", "model_file"} <= {a.path for a in client.list_artifacts(run_id)}
        assert not any(outbox.iterdir())
    finally:
        server.kill()


def _wait_for_open_run(client, stage: subprocess.Popen, name: str, err: Path,
                       timeout_s: float = 300) -> str:
    """The id of the stage's run once the server holds it as RUNNING."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        assert stage.poll() is None, f"the stage ended before its run opened:\n{err.read_text()}"
        exp = client.get_experiment_by_name("tfmlops")
        runs = [] if exp is None else client.search_runs(
            [exp.experiment_id], f"tags.`tfmlops.stage` = '{name}' and attributes.status = 'RUNNING'")
        if runs:
            return runs[0].info.run_id
        time.sleep(0.2)
    raise AssertionError(f"no RUNNING {name} run after {timeout_s:.0f} s")


# ------------------------------------------------ outbox rules, on a local store

def test_a_refused_call_is_reported_and_does_not_send_the_run_offline(make_cfg, tmp_path):
    cfg = make_cfg()
    with tracking.stage_run(cfg, "outbox-rules", tmp_path / "out", params={"a": 1}) as run:
        run.log_params({"a": 2})  # MLflow refuses to change a logged param
        run.log_metrics({"m": 1.0})
    assert any("refused" in e for e in run.errors)
    assert not (Path(cfg.paths.reports) / "outbox").exists()
    got = mlflow_client(cfg).get_run(run.run_id)
    assert got.data.metrics["m"] == 1.0 and got.info.status == "FINISHED"


def test_sync_stops_at_a_failing_call_and_keeps_the_rest(make_cfg, tmp_path):
    cfg = make_cfg()
    with tracking.stage_run(cfg, "outbox-rules", tmp_path / "out", params={}) as run:
        pass
    outbox = Path(cfg.paths.reports) / "outbox"
    outbox.mkdir(parents=True)
    queued = [{"run_id": run.run_id, "op": "metrics",
               "payload": {"metrics": {"m": 3.0}, "step": 1, "timestamp": 1_700_000_000_000}},
              {"run_id": "0" * 32, "op": "tags", "payload": {"k": "v"}},  # not in this store
              {"run_id": run.run_id, "op": "tags", "payload": {"k": "v"}}]
    file = outbox / f"outbox-rules-{run.run_id}.jsonl"
    file.write_text("".join(json.dumps(e) + "\n" for e in queued))
    with pytest.raises(TrackingUnavailable, match=r"call 2 \(tags of run 0{32}\).*1 calls sent, 2 kept"):
        tracking.sync(cfg)
    assert [json.loads(line) for line in file.read_text().splitlines()] == queued[1:]
    (metric,) = mlflow_client(cfg).get_metric_history(run.run_id, "m")
    assert (metric.value, metric.step, metric.timestamp) == (3.0, 1, 1_700_000_000_000)
