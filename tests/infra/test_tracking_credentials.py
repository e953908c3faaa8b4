"""Issue 14.10: a tracking URI with a password (a real PostgreSQL store) runs a stage,
and neither `mlflow_run.json` (a DVC output, pushed) nor the logs keep the password."""

import json
import logging

import pytest
from live_services import libpq_uri, postgres_cluster

from tfmlops import tracking

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a PostgreSQL server


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
        cfg = make_cfg(tracking={"uri": secret_uri})
        out = tmp_path / "out"
        with caplog.at_level(logging.DEBUG, logger="tfmlops"):
            with tracking.stage_run(cfg, "prepare", out) as run:
                run.log_metrics({"accuracy": 0.5})
        run_file = json.loads((out / tracking.RUN_FILE).read_text())
        assert run_file["tracking_uri"] == f"{scheme}://{host}"
        assert run_file["run_id"] == run.run_id
        client = tracking.use_uri(secret_uri).MlflowClient()
        assert client.get_run(run.run_id).data.metrics["accuracy"] == 0.5
    assert "S3CRET" not in (out / tracking.RUN_FILE).read_text()
    assert "S3CRET" not in caplog.text
