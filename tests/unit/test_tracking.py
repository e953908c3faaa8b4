"""Pure parts of the tracking module: where the store is, who records."""

import json
import re
from pathlib import Path

import pytest

from conftest import mlflow_client, stage_runs
from tfmlops import tracking
from tfmlops.artifacts import TAG_STAGE
from tfmlops.config import Config, TrackingConfig


def test_repo_root_climbs_out_of_a_dvc_temp_experiment(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    temp_copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    temp_copy.mkdir(parents=True)
    (temp_copy / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert tracking.repo_root(temp_copy) == tmp_path
    assert tracking.repo_root(tmp_path) == tmp_path
    monkeypatch.chdir(temp_copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri(Config()) == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_environment_uri_wins_over_params(monkeypatch):
    cfg = Config(tracking=TrackingConfig(uri="sqlite:////tmp/x/mlflow.db"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri(cfg) == "sqlite:////tmp/x/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri(cfg) == "http://127.0.0.1:5999"


def test_an_exported_uri_stays_the_users_after_mlflow_is_pointed_at_it(monkeypatch, tmp_path):
    """The sidecar points MLflow at the user's MLFLOW_TRACKING_URI before it opens the
    run: that must not be mistaken for MLflow's own echo of a URI set here."""
    cfg = Config(tracking=TrackingConfig(uri=f"sqlite:///{tmp_path / 'params.db'}"))
    chosen = f"sqlite:///{tmp_path / 'exported.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chosen)
    tracking.use_uri(chosen)
    assert tracking.tracking_uri(cfg) == chosen
    other = f"sqlite:///{tmp_path / 'other.db'}"
    tracking.use_uri(other)  # exported by set_tracking_uri, not by the user: params win
    assert tracking.tracking_uri(cfg) == f"sqlite:///{tmp_path / 'params.db'}"


def test_local_artifacts_sit_beside_the_database():
    assert tracking.artifact_location("sqlite:////srv/ml/mlflow.db") == "file:///srv/ml/mlartifacts"
    assert tracking.artifact_location("http://server:5000") is None


@pytest.mark.parametrize(
    "tf_config, chief",
    [
        (None, True),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}, True),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}, False),
        ({"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}},
         True),
        ({"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}},
         False),
    ],
)
def test_only_the_chief_records(monkeypatch, tf_config, chief):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert tracking.is_chief() is chief


def test_unreachable_server_fails_at_once_naming_the_uri():
    with pytest.raises(tracking.TrackingUnavailable, match=r"http://127.0.0.1:9 is unreachable"):
        tracking.ensure_reachable("http://127.0.0.1:9", timeout_s=2)


def test_tracking_disabled_records_nothing_but_the_run_file(tmp_path, make_cfg):
    cfg = make_cfg(tracking={"enabled": False})
    with tracking.stage_run(cfg, "prepare", tmp_path / "out") as run:
        assert not run.active
        run.log_metrics({"a": 1.0})
    assert json.loads((tmp_path / "out" / tracking.RUN_FILE).read_text())["run_id"] is None
    assert not (tmp_path / "mlflow.db").exists()


def test_experiment_opens_in_the_model_training_view(tmp_path, make_cfg):
    """MLflow 3's UI shows the GenAI overview unless the experiment says it is training."""
    cfg = make_cfg()
    with tracking.stage_run(cfg, "prepare", tmp_path / "out", params={"a": 1}):
        pass
    exp = mlflow_client(cfg).get_experiment_by_name(cfg.tracking.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_an_existing_experiment_without_its_kind_gets_it(tmp_path, make_cfg):
    cfg = make_cfg()
    client = mlflow_client(cfg)
    client.create_experiment(cfg.tracking.experiment)  # as an older tfmlops left it
    assert "mlflow.experimentKind" not in client.get_experiment_by_name(cfg.tracking.experiment).tags
    with tracking.stage_run(cfg, "prepare", tmp_path / "out", params={"a": 1}):
        pass
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def _run_names(cfg, stage):
    return sorted(r.info.run_name for r in stage_runs(cfg, stage))


@pytest.mark.slow
def test_run_name_is_stage_plus_a_digest_of_the_params_it_reads(tmp_path, make_cfg, monkeypatch):
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    cfg = make_cfg()
    for lr in (0.1, 0.01, 0.1):
        with tracking.stage_run(cfg, "train", tmp_path / "out", params={"train": {"lr": lr}}):
            pass
    names = _run_names(cfg, "train")
    assert all(re.fullmatch(r"train-[0-9a-f]{6}", n) for n in names), names
    assert len(set(names)) == 2  # other params, other name; the same params, the same name


def test_run_name_under_dvc_exp_run_is_the_experiment_name(tmp_path, make_cfg, monkeypatch):
    monkeypatch.setenv("DVC_EXP_NAME", "lean-fish")  # what `dvc exp run` hands each stage
    cfg = make_cfg()
    with tracking.stage_run(cfg, "train", tmp_path / "out", params={"train": {"lr": 0.1}}):
        pass
    (run,) = stage_runs(cfg, "train")
    assert run.info.run_name == "train-lean-fish"
    assert run.data.tags[TAG_STAGE] == "train" and run.data.tags["dvc.exp_name"] == "lean-fish"


# ------------------------------ issue 14.10: credentials never written or logged

@pytest.mark.parametrize("uri, shown", [
    ("postgresql+psycopg2://u:SECRET@db.example:5432/mlflow",
     "postgresql+psycopg2://db.example:5432/mlflow"),
    ("http://user:SECRET@mlflow.example:5000", "http://mlflow.example:5000"),
    ("https://user:SE@CR/ET@mlflow.example/", "https://mlflow.example/"),  # raw @ and / in it
    ("postgresql://db/mlflow?user=u&password=SECRET&sslmode=require",
     "postgresql://db/mlflow?user=u&password=***&sslmode=require"),
    ("https://mlflow.example/?token=SECRET", "https://mlflow.example/?token=***"),
    ("sqlite:////tmp/x/mlflow.db", "sqlite:////tmp/x/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("models:/digits@production", "models:/digits@production"),
    ("http://user:it's SE CRET@mlflow.example:5000", "http://mlflow.example:5000"),  # ' and spaces
    ("https://u:\"q\" <x>@mlflow.example/", "https://mlflow.example/"),
])
def test_redact_strips_credentials_and_keeps_the_rest(uri, shown):
    assert tracking.redact(uri) == shown
    assert tracking.redact(f"stopped on {uri}: refused") == f"stopped on {shown}: refused"


def test_preflight_passes_a_server_behind_basic_auth_with_credentials_in_the_uri():
    """`http://user:password@host` is how MLflow's client takes Basic auth: the preflight
    must send it the same way, not read `user:password@host` as a host name."""
    import base64
    import http.server
    import threading

    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's API
            seen.append((self.path, self.headers.get("Authorization")))
            ok = self.headers.get("Authorization") == "Basic " + base64.b64encode(
                b"alice:it's s@cret").decode()
            self.send_response(200 if ok else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        tracking.ensure_reachable(f"http://alice:it%27s%20s%40cret@127.0.0.1:{port}/",
                                  timeout_s=5)
        tracking.ensure_reachable(f"http://alice:it's s@cret@127.0.0.1:{port}", timeout_s=5)
        with pytest.raises(tracking.TrackingUnavailable) as err:  # a wrong password: one line
            tracking.ensure_reachable(f"http://alice:wrong pw@127.0.0.1:{port}", timeout_s=5)
    finally:
        server.shutdown()
    assert [path for path, _ in seen] == ["/health"] * 3
    assert "wrong" not in str(err.value) and "401" in str(err.value)


def test_run_file_and_messages_carry_no_credentials(tmp_path):
    from tfmlops.tracking.lineage import write_run_file
    from tfmlops.tracking.retry import first_line

    write_run_file(tmp_path, "train", "abc", "postgresql+psycopg2://u:SECRET@db:5432/mlflow")
    data = json.loads((tmp_path / tracking.RUN_FILE).read_text())
    assert data["tracking_uri"] == "postgresql+psycopg2://db:5432/mlflow"
    with pytest.raises(tracking.TrackingUnavailable) as err:
        tracking.ensure_reachable("http://u:SECRET@127.0.0.1:9", timeout_s=2)
    assert "SECRET" not in str(err.value) and "http://127.0.0.1:9 is unreachable" in str(err.value)
    # MLflow's REST errors quote the URL they called
    exc = RuntimeError("API request to http://u:SECRET@h:5000/api/2.0/mlflow/runs/get failed")
    assert first_line(exc) == "API request to http://h:5000/api/2.0/mlflow/runs/get failed"


def test_a_stage_links_prepares_run_only_if_it_made_the_data_read(tmp_path, make_cfg):
    """prepare's run file sits in reports/prepare/ with the data version its run made; a
    later stage links to that run (tfmlops.upstream.prepare) only while paths.prepared
    holds that version: after a `dvc checkout` of other data the link would be false."""
    from tfmlops.artifacts import DATA_VERSION, MANIFEST, data_version, run_dir
    from tfmlops.tracking.lineage import run_tags, write_run_file

    cfg = make_cfg()
    prepared = Path(cfg.paths.prepared)
    prepared.mkdir(parents=True)
    (prepared / MANIFEST).write_text('{"files": []}')
    upstream = {"prepare": run_dir(cfg, "prepare")}
    write_run_file(run_dir(cfg, "prepare"), "prepare", "run-a", None,
                   {DATA_VERSION: data_version(prepared)})
    assert run_tags(cfg, "train", upstream)["tfmlops.upstream.prepare"] == "run-a"
    (prepared / MANIFEST).write_text('{"files": ["other data"]}')
    assert "tfmlops.upstream.prepare" not in run_tags(cfg, "train", upstream)
