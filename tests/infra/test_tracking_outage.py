"""Tracking outages: a server away at the start stops a stage before any work; a
server that dies mid-run costs nothing but an outbox that `tfmlops sync` replays.
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from live_services import MlflowServer

from conftest import VENV_BIN, child_env, free_port, mlflow_client, run_cli
from tfmlops import tracking
from tfmlops.artifacts import MODEL_FILE
from tfmlops.errors import TrackingUnavailable
from tfmlops.stages.tune.report import draw_plots


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
    assert (Path(cfg.paths.train) / MODEL_FILE).is_file()
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
        # stdout is the result alone: MLflow's "View run ... at <URI>" lines are off (a URI
        # with a password would be printed; `tfmlops sync | jq` would break)
        assert json.loads(synced.stdout) == {
            "files": 1, "calls": len(entries), "rejected": 0, "other_store": 0}
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


def _queue_file(cfg, run_id: str, entries: list[dict], extra: str = "") -> Path:
    outbox = Path(cfg.paths.reports) / "outbox"
    outbox.mkdir(parents=True, exist_ok=True)
    file = outbox / f"outbox-rules-{run_id}.jsonl"
    file.write_text("".join(json.dumps(e) + "\n" for e in entries) + extra)
    return file


def _finished_run(cfg, tmp_path) -> str:
    with tracking.stage_run(cfg, "outbox-rules", tmp_path / "out", params={}) as run:
        pass
    return run.run_id


def _metric(run_id: str, value: float) -> dict:
    return {"run_id": run_id, "op": "metrics",
            "payload": {"metrics": {"m": value}, "step": 1, "timestamp": 1_700_000_000_000}}


def _rejected(file: Path) -> list[dict]:
    return [json.loads(line) for line in file.with_suffix(".rejected").read_text().splitlines()]


def test_sync_stops_at_a_failing_call_and_keeps_the_rest(make_cfg, tmp_path):
    # the store cannot take the artifact now (its artifact folder is a file): not a
    # refusal but a broken store, so sync stops there and resumes once it is fixed
    cfg = make_cfg()
    run_id = _finished_run(cfg, tmp_path)
    artifacts = tmp_path / "mlartifacts"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.write_text("not a folder")
    report = tmp_path / "report.json"
    report.write_text("{}")
    queued = [_metric(run_id, 3.0),
              {"run_id": run_id, "op": "artifact", "payload": {"path": str(report),
                                                               "artifact_path": "r"}},
              {"run_id": run_id, "op": "tags", "payload": {"k": "v"}}]
    file = _queue_file(cfg, run_id, queued)
    with pytest.raises(TrackingUnavailable, match=rf"call 2 \(artifact of run {run_id}\).*1 calls "
                                                  "sent, 2 kept"):
        tracking.sync(cfg)
    assert [json.loads(line) for line in file.read_text().splitlines()] == queued[1:]
    (metric,) = mlflow_client(cfg).get_metric_history(run_id, "m")
    assert (metric.value, metric.step, metric.timestamp) == (3.0, 1, 1_700_000_000_000)
    artifacts.unlink()  # the store is fixed: the same command resumes
    assert tracking.sync(cfg) == {"files": 1, "calls": 2, "rejected": 0, "other_store": 0}
    assert mlflow_client(cfg).get_run(run_id).data.tags["k"] == "v"
    assert not file.exists()


def test_a_line_torn_by_a_kill_is_set_aside_and_the_rest_is_sent(make_cfg, tmp_path):
    cfg = make_cfg()
    run_id = _finished_run(cfg, tmp_path)
    whole = json.dumps({"run_id": run_id, "op": "tags", "payload": {"late": "yes"}})
    torn = whole[: len(whole) // 2]  # what a kill during the append leaves
    file = _queue_file(cfg, run_id, [_metric(run_id, 1.0)], extra=torn)
    assert tracking.sync(cfg) == {"files": 1, "calls": 1, "rejected": 1, "other_store": 0}
    (rejected,) = _rejected(file)
    assert rejected["entry"] == {"line": torn} and "line 2 unreadable" in rejected["reason"]
    assert mlflow_client(cfg).get_metric_history(run_id, "m")[0].value == 1.0
    assert not file.exists()
    assert tracking.sync(cfg)["files"] == 0  # and it no longer fails every later sync


def test_a_refused_call_is_set_aside_and_blocks_nothing(make_cfg, tmp_path):
    cfg = make_cfg()
    run_id = _finished_run(cfg, tmp_path)
    gone = {"run_id": "0" * 32, "op": "tags", "payload": {"k": "v"}}  # deleted / never here
    file = _queue_file(cfg, run_id, [_metric(run_id, 2.0), gone,
                                     {"run_id": run_id, "op": "tags", "payload": {"k": "v"}}])
    later = _queue_file(cfg, "later", [{"run_id": run_id, "op": "tags", "payload": {"j": "w"}}])
    assert tracking.sync(cfg) == {"files": 2, "calls": 3, "rejected": 1, "other_store": 0}
    (rejected,) = _rejected(file)
    assert rejected["entry"]["run_id"] == "0" * 32
    assert rejected["reason"].startswith("refused by sqlite:///") and "0" * 32 in rejected["reason"]
    tags = mlflow_client(cfg).get_run(run_id).data.tags
    assert tags["k"] == "v" and tags["j"] == "w"
    assert not file.exists() and not later.exists()


def test_lines_of_another_store_wait_for_that_store(make_cfg, tmp_path):
    cfg = make_cfg()
    run_id = _finished_run(cfg, tmp_path)
    here = json.loads((tmp_path / "out" / tracking.RUN_FILE).read_text())["tracking_uri"]
    elsewhere = {"run_id": "f" * 32, "op": "tags", "payload": {"k": "v"},
                 "store": "postgresql+psycopg2://db.example/mlflow"}
    ours = {**_metric(run_id, 4.0), "store": here}
    file = _queue_file(cfg, run_id, [elsewhere, ours])
    assert tracking.sync(cfg) == {"files": 1, "calls": 1, "rejected": 0, "other_store": 1}
    assert [json.loads(line) for line in file.read_text().splitlines()] == [elsewhere]
    assert not file.with_suffix(".rejected").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_child_runs_opened_while_the_store_is_away_are_queued_and_synced(tmp_path, make_cfg,
                                                                         monkeypatch):
    import mlflow

    server = MlflowServer(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "server-artifacts",
                          tmp_path).start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    cfg = make_cfg(tracking={"retries": 0, "connect_timeout_s": 2.0})
    try:
        with tracking.stage_run(cfg, "tune", tmp_path / "out") as parent:
            server.kill()  # the store goes away mid-search
            # tune's trials, as its sidecar opens and ends them
            trial = parent.start_child("trial-0", tags={"tfmlops.trial": "0"})
            trial.log_metrics({"val_accuracy": 0.75}, step=1)
            nested = trial.start_child("finalist")  # a child of a queued child
            nested.log_metrics({"score": 0.5})
            nested.end()
            trial.end()
            # drawn into a scratch folder that is gone once queued: the outbox keeps a copy
            rows = [{"trial": 0, "score": 0.75, "status": "COMPLETED", "schedule": "constant",
                     "learning_rate": 0.01}]
            parent.log_drawn(draw_plots, ("val_accuracy", "random", rows), "plots")
        assert trial.run_id.startswith("pending-") and trial.queued >= 3
        (queue,) = (Path(cfg.paths.reports) / "outbox").glob("*.jsonl")
        entries = [json.loads(line) for line in queue.read_text().splitlines()]
        assert [e["op"] for e in entries if e["run_id"] == trial.run_id][0] == "create_run"
        assert {e["store"] for e in entries} == {server.url}

        server.start()
        synced = run_cli("sync", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": server.url})
        result = json.loads(synced.stdout.splitlines()[-1])
        assert result == {"files": 1, "calls": len(entries), "rejected": 0, "other_store": 0}
        assert not queue.exists()
        client = mlflow.MlflowClient(server.url)
        assert client.get_run(parent.run_id).info.status == "FINISHED"
        exp = client.get_run(parent.run_id).info.experiment_id
        (child,) = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent.run_id}'")
        assert child.info.run_name == "trial-0" and child.info.status == "FINISHED"
        assert child.data.tags["tfmlops.trial"] == "0" and child.data.metrics["val_accuracy"] == 0.75
        (grandchild,) = client.search_runs(
            [exp], f"tags.`mlflow.parentRunId` = '{child.info.run_id}'")
        assert grandchild.data.metrics["score"] == 0.5
        assert grandchild.info.status == "FINISHED"
        assert [a.path for a in client.list_artifacts(parent.run_id, "plots")] == [
            "plots/tune_score_per_trial.png", "plots/tune_score_vs_learning_rate.png"]
    finally:
        server.kill()
