"""A tracking URI with a password is used but never written: against a real PostgreSQL
store (issue 14.10), and against an HTTP store behind Basic auth (issue 47, M2), where
MLflow itself printed each ended run's link, password included, to stdout."""

import base64
import json
import logging
import subprocess
from pathlib import Path

import pytest
import yaml
from live_services import BasicAuthProxy, libpq_uri, mlflow_server, postgres_cluster

from conftest import VENV_BIN, child_env, tiny_params
from images import photo_folder
from tfmlops import tracking

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a PostgreSQL server, an mlflow server


def test_password_in_the_uri_is_used_but_never_written(tmp_path, make_cfg, monkeypatch, caplog):
    import psycopg2

    # password authentication: a stage that dropped the password could not connect
    with postgres_cluster(password="S3CRET-pw") as pg_uri:
        scheme, rest = pg_uri.split("://", 1)
        user, host = rest.split("@", 1)
        secret_uri = f"{scheme}://{user}:S3CRET-pw@{host}"
        for refused in (pg_uri, f"{scheme}://{user}:wrong-pw@{host}"):
            with pytest.raises(psycopg2.OperationalError, match="password"):
                psycopg2.connect(libpq_uri(refused)).close()
        # MLFLOW_TRACKING_URI, as docs/scaling.md says: params.yaml refuses a password
        monkeypatch.setenv("MLFLOW_TRACKING_URI", secret_uri)
        cfg = make_cfg()
        out = tmp_path / "out"
        with caplog.at_level(logging.DEBUG, logger="tfmlops"):
            with tracking.stage_run(cfg, "prepare", out) as run:
                run.log_metrics({"accuracy": 0.5})
        run_file = json.loads((out / tracking.RUN_FILE).read_text())
        assert run_file["tracking_uri"] == f"{scheme}://{host}"
        assert run_file["run_id"] == run.run_id
        client = tracking.use_uri(secret_uri).MlflowClient()
        stored = client.get_run(run.run_id)
        assert stored.data.metrics["accuracy"] == 0.5
        assert "S3CRET" not in json.dumps([stored.data.params, stored.data.tags, stored.info.run_name])
    assert "S3CRET" not in (out / tracking.RUN_FILE).read_text()
    assert "S3CRET" not in caplog.text


# The planted password (in the URI percent-encoded: MLflow's client and the preflight
# must both decode it) and a wrong one.
PASSWORD, WRONG = "pl4nted!Pw-47", "wr0ng!Pw-47"


def _planted(password: str) -> list[bytes]:
    """Every form the password could be written in: as given, encoded in the URI, and
    inside the Basic auth header."""
    return [password.encode(), password.replace("!", "%21").encode(),
            base64.b64encode(f"alice:{password}".encode())]


def _uri(proxy: BasicAuthProxy, password: str) -> str:
    return proxy.uri("alice", password.replace("!", "%21"))


def _cli(work: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    """`tfmlops ARGS` against `uri`, as a user runs it: without the switch that turns
    MLflow's link printing off, which this process may hold (tracking.import_mlflow)."""
    env = {k: v for k, v in child_env().items() if k != "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"}
    return subprocess.run([str(VENV_BIN / "tfmlops"), *args], cwd=work, capture_output=True,
                          text=True, timeout=240, env={**env, "MLFLOW_TRACKING_URI": uri})


def _one_json_line(proc: subprocess.CompletedProcess) -> dict:
    """The command's stdout is its JSON result alone (`tfmlops promote | jq`)."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def test_a_password_in_an_http_store_uri_reaches_no_output_store_or_message(tmp_path):
    """A stage (prepare), promote, sync (failing, then replaying the outbox) and a wrong
    password, each in its own process against `http://alice:<password>@...` (an mlflow
    server behind a Basic auth proxy); then the password is searched for in every place
    it could land: stdout, stderr, every file of the project (reports/** with the
    tracking logs and mlflow_run.json, the outbox, data/prepared), the server's database
    (params, tags, run names, the registry) and artifacts, and the store through its API."""
    from mlflow import MlflowClient

    from tfmlops.config import load_config
    from tfmlops.tracking.outbox import Outbox, outbox_path

    work = tmp_path / "work"
    photo_folder(work / "photos", per_class=6, classes=2)
    params = tiny_params(work, data={"image_dir": str(work / "photos"), "channels": 3},
                         tracking={"wait": True})  # prepare's run is stored before it exits
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    outputs = []
    with mlflow_server(f"sqlite:///{server_dir / 'mlflow.db'}", server_dir / "artifacts",
                       server_dir) as server, BasicAuthProxy(server.url, "alice", PASSWORD) as proxy:
        uri = _uri(proxy, PASSWORD)

        def run(*args: str, password_uri: str = uri) -> subprocess.CompletedProcess:
            outputs.append(proc := _cli(work, password_uri, *args))
            return proc

        assert _one_json_line(run("prepare"))["images_good"] == 12
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        name = params["promote"]["registered_model"]
        client.create_registered_model(name)
        experiment = client.get_experiment_by_name(params["tracking"]["experiment"]).experiment_id
        source = client.create_run(experiment, run_name="source").info.run_id
        client.create_model_version(name, f"runs:/{source}/model", run_id=source)
        # promote ends its run in this process: MLflow printed its link here, twice
        assert _one_json_line(run("promote", "--version", "1", "--force", "--reason", "M2"))[
            "outcome"] == "forced"

        # calls a run queued while the server was away, replayed by `tfmlops sync`
        queued = client.create_run(experiment, run_name="queued").info.run_id
        cfg = load_config(work / "params.yaml")
        box = Outbox(outbox_path(cfg, f"prepare-{queued}"), uri)
        box.write(queued, "tags", {"queued": "yes"})
        box.write(queued, "end", {"status": "FINISHED"})
        proxy.broken = True  # up but failing: MLflow's error names the URI it called
        failed = run("sync")
        assert failed.returncode == 2 and "sync stopped" in failed.stderr, failed.stderr
        proxy.broken = False
        assert _one_json_line(run("sync"))["calls"] == 2
        assert client.get_run(queued).info.status == "FINISHED"

        refused = run("promote", "--version", "1", "--force", "--reason", "wrong",
                      password_uri=_uri(proxy, WRONG))
        assert refused.returncode == 2 and "check the user and password" in refused.stderr
        assert proxy.refused >= 1

        runs = client.search_runs([experiment])
        assert {r.data.tags.get("tfmlops.stage") for r in runs} >= {"prepare", "promote"}
        stored = json.dumps([[r.data.params, r.data.tags, r.info.run_name] for r in runs]
                            + [dict(v.tags) for v in client.search_model_versions(f"name='{name}'")]
                            + [dict(client.get_registered_model(name).tags)])

    texts = [(f"{' '.join(p.args[1:])} {stream}", getattr(p, stream).encode())
             for p in outputs for stream in ("stdout", "stderr")]
    files = [p for folder in (work, server_dir) for p in sorted(folder.rglob("*")) if p.is_file()]
    assert any(p.name == tracking.RUN_FILE for p in files) and (work / "reports").is_dir()
    texts += [(str(p), p.read_bytes()) for p in files]
    texts.append(("the store's params, tags, run names and registry tags", stored.encode()))
    for password in (PASSWORD, WRONG):
        for where, data in texts:
            found = [form for form in _planted(password) if form in data]
            assert not found, f"{where} holds the password {found}"
