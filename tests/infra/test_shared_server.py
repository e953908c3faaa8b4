"""The pipeline, unchanged, against a shared `mlflow server` on PostgreSQL.

Only MLFLOW_TRACKING_URI changes. The server keeps runs in a real PostgreSQL
cluster and artifacts in its own artifact store (proxied uploads), so nothing
of the run lands in the workdir. In CI this test fails, never skips, when
PostgreSQL is missing.
"""

import json
import uuid
from pathlib import Path

import pytest
from live_services import libpq_uri, mlflow_server, postgres_cluster

from conftest import run_cli
from tfmlops.artifacts import DATA_VERSION, MANIFEST, RUN_FILE, TAG_DATA_VERSION, run_dir
from tfmlops.tracking.lineage import wait_delivered

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(900)]


@pytest.fixture
def shared_server(tmp_path):
    with postgres_cluster() as pg_uri, mlflow_server(pg_uri, tmp_path / "artifact-store",
                                                     tmp_path) as server:
        server.pg_uri = pg_uri
        yield server


def test_stage_runs_unchanged_against_postgres_server(tmp_path, make_cfg, shared_server):
    import mlflow
    import psycopg2

    work = tmp_path / "work"
    work.mkdir()
    experiment = f"shared-{uuid.uuid4().hex[:8]}"  # isolated also on an external database
    cfg = make_cfg(workdir=work, tracking={"experiment": experiment})
    env = {"MLFLOW_TRACKING_URI": shared_server.url}
    run_cli("materialize", cwd=work, env=env)
    run_cli("prepare", cwd=work, env=env)
    assert wait_delivered(run_dir(cfg, "prepare"), timeout_s=120)  # it exits before that

    client = mlflow.MlflowClient(shared_server.url)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None and exp.artifact_location.startswith("mlflow-artifacts:")
    (run,) = client.search_runs([exp.experiment_id], "tags.`tfmlops.stage` = 'prepare'")
    assert run.info.status == "FINISHED"
    assert run.data.params["data.image_size"] == "16"
    assert run.data.metrics["images_good"] == 1797
    assert run.data.tags[TAG_DATA_VERSION]
    run_file = json.loads((run_dir(cfg, "prepare") / RUN_FILE).read_text())
    assert run_file == {"stage": "prepare", "run_id": run.info.run_id,
                        "tracking_uri": shared_server.url,
                        DATA_VERSION: run.data.tags[TAG_DATA_VERSION]}

    # The run is a row of PostgreSQL, not of a local file store.
    with psycopg2.connect(libpq_uri(shared_server.pg_uri)) as conn, conn.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_uuid = %s", (run.info.run_id,))
        assert cur.fetchall() == [("FINISHED",)]
        cur.execute("SELECT count(*) FROM metrics WHERE run_uuid = %s", (run.info.run_id,))
        assert cur.fetchone()[0] >= 9

    # Artifacts went through the server into its artifact store, and read back equal.
    assert {a.path for a in client.list_artifacts(run.info.run_id, "prepared")} >= {
        "prepared/manifest.json", "prepared/stats.json"}
    stored = list((tmp_path / "artifact-store").rglob(MANIFEST))
    assert len(stored) == 1 and run.info.run_id in str(stored[0])
    local = (Path(cfg.paths.prepared) / MANIFEST).read_bytes()
    assert stored[0].read_bytes() == local
    fetched = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="prepared/manifest.json",
        dst_path=str(tmp_path / "download"), tracking_uri=shared_server.url)
    assert Path(fetched).read_bytes() == local

    # Nothing of the tracking store landed in the workdir.
    assert not (work / "mlflow.db").exists() and not (work / "mlartifacts").exists()
    assert not list(work.rglob("mlruns"))
