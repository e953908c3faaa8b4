"""`promote` on a real MLflow registry (temp SQLite): the gate, rollback, force, races.

Each test owns a registered model of its own in the exported store. Its
versions are registered from the really exported model with the tags export
wrote; a "worse" or "better" model is that model with a lower or higher
`serving.accuracy` tag, which is all the gate reads.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import VENV_BIN, child_env, mlflow_client, run_cli
from tfmlops.artifacts import REGISTERED
from tfmlops.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # on the exported model


@pytest.fixture
def store(exported_digits, tmp_path, request):
    """(cfg for a fresh registered model in the exported store, register(accuracy_delta))."""
    from tfmlops.artifacts import TAG_ACCURACY
    from tfmlops.registry import Registry

    source = exported_digits
    registered = json.loads((Path(source.paths.export) / REGISTERED).read_text())
    base_tags = Registry(source).tags(registered["version"])
    name = f"promote-{request.node.name}".replace("[", "-").replace("]", "")
    params = yaml.safe_load((Path(source.paths.export).parent.parent / "params.yaml").read_text())
    params["promote"]["registered_model"] = name
    params["paths"]["reports"] = str(tmp_path / "reports")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cfg = load_config(tmp_path / "params.yaml")
    registry = Registry(cfg)
    accuracy = float(base_tags[TAG_ACCURACY])

    def register(delta: float = 0.0) -> str:
        tags = {**base_tags, TAG_ACCURACY: f"{accuracy + delta:.6f}"}
        return registry.register(registered["model_uri"], tags, "test copy of the export")

    return cfg, registry, register


def decision(cfg) -> dict:
    return json.loads((Path(cfg.paths.reports) / "promote.json").read_text())


def test_gate_promotes_a_better_model_refuses_a_worse_one_and_rollback_restores(store):
    from tfmlops.stages import promote

    cfg, registry, register = store
    v1, worse, better = register(0.0), register(-0.05), register(+0.01)

    assert promote.run(cfg, version=int(v1))["outcome"] == "promoted"
    assert registry.aliases() == {"production": v1}

    result = promote.run(cfg, version=int(worse))
    assert result["outcome"] == "refused"
    assert registry.aliases() == {"production": v1, "candidate": worse}
    d = decision(cfg)
    assert d["failed"] == ["max_regression"]
    assert "worse by more than max_regression" in d["summary"] and "(by 0.0450)" in d["summary"]

    assert promote.run(cfg, version=int(better))["outcome"] == "promoted"
    assert registry.aliases() == {"production": better, "previous": v1, "candidate": worse}
    assert registry.tags(better)["promote.replaced"] == v1

    assert promote.run(cfg, rollback=True)["production"] == v1
    assert registry.aliases() == {"production": v1, "candidate": worse}
    assert decision(cfg)["action"] == "rollback"

    runs = _promote_runs(cfg)
    assert len(runs) == 4
    outcomes = sorted(r.data.tags["tfmlops.promote.outcome"] for r in runs)
    assert outcomes == ["promoted", "promoted", "refused", "rolled_back"]
    client = mlflow_client(cfg)
    assert "decision.json" in {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    _history_lists_every_move_in_order(cfg, v1, worse, better)


def _history_lists_every_move_in_order(cfg, v1: str, worse: str, better: str) -> None:
    """`tfmlops history`: the promote, the refusal, the promote and the rollback above, in
    order, with who and why; through the CLI as a table and as JSON."""
    from tfmlops.promotion import history

    rows = history(cfg)
    assert [(r["action"], r["outcome"], r["from"], r["to"], r["candidate"]) for r in rows] == [
        ("promote", "promoted", "-", v1, v1), ("promote", "refused", v1, v1, worse),
        ("promote", "promoted", v1, better, better), ("rollback", "rolled_back", better, v1, v1)]
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)
    assert all(r["user"] for r in rows)
    assert "worse by more than max_regression" in rows[1]["why"]
    assert rows[3]["why"].startswith(f"rolled back @production from version {better} to {v1}")

    folder = Path(cfg.paths.reports).parent  # the store fixture's params.yaml
    table = run_cli("history", cwd=folder).stdout.splitlines()
    assert table[0].split() == ["time", "user", "action", "outcome", "from", "to", "candidate",
                                "why"]
    assert [line.split()[2:7] for line in table[1:]] == [
        ["promote", "promoted", "-", v1, v1], ["promote", "refused", v1, v1, worse],
        ["promote", "promoted", v1, better, better], ["rollback", "rolled_back", better, v1, v1]]
    as_json = json.loads(run_cli("history", "--json", cwd=folder).stdout.splitlines()[-1])
    assert [r["run_id"] for r in as_json] == [r["run_id"] for r in rows]


def test_force_promotes_past_the_gate_and_says_so(store):
    from tfmlops.stages import promote

    cfg, registry, register = store
    good, poor = register(0.0), register(-0.3)
    promote.run(cfg, version=int(good))
    result = promote.run(cfg, version=int(poor), force=True)
    assert result["outcome"] == "forced"
    assert registry.aliases() == {"production": poor, "previous": good}
    d = decision(cfg)
    assert d["forced"] is True and set(d["failed"]) >= {"max_regression"}
    assert "FORCED past" in d["summary"]


def test_refusal_exits_0_unless_the_pipeline_must_fail(store, tmp_path):
    """Through the CLI: a refused default candidate exits 0; with fail_pipeline, 2 in one line."""
    cfg, registry, register = store
    worse = register(-0.5)  # below min_accuracy
    registered = {"name": registry.name, "version": worse, "run_id": None, "model_uri": None}
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["paths"]["export"] = str(tmp_path / "export")
    Path(params["paths"]["export"]).mkdir()
    (Path(params["paths"]["export"]) / REGISTERED).write_text(json.dumps(registered))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    proc = run_cli("promote", cwd=tmp_path)
    assert f"refused version {worse}" in proc.stderr and "short by" in proc.stderr
    assert registry.aliases() == {"candidate": worse}

    params["promote"]["fail_pipeline"] = True
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = run_cli("promote", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    error = [line for line in proc.stderr.splitlines() if line.startswith("tfmlops promote:")]
    assert len(error) == 1 and "promote.fail_pipeline is true" in error[0]


def test_rollback_without_previous_fails_clearly(store):
    from tfmlops.errors import DataError
    from tfmlops.stages import promote

    cfg, _registry, register = store
    promote.run(cfg, version=int(register(0.0)))
    with pytest.raises(DataError, match="no @previous version to roll back to"):
        promote.run(cfg, rollback=True)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_concurrent_promotions_serialize(store, tmp_path):
    """Both wait on the lock, then run one after the other: one production, two decisions."""
    from tfmlops.stages import promote

    cfg, registry, register = store
    first = register(0.0)
    promote.run(cfg, version=int(first))
    a, b = register(0.0), register(0.0)
    logs = {v: tmp_path / f"promote-{v}.log" for v in (a, b)}
    env = {**child_env()}
    with registry.promotion_lock():  # both processes start while the lock is taken
        procs = [subprocess.Popen([str(VENV_BIN / "tfmlops"), "promote", "--version", v],
                                  cwd=tmp_path, env=env, stdout=logs[v].open("w"),
                                  stderr=subprocess.STDOUT) for v in (a, b)]
        deadline = time.monotonic() + 120
        while not all("waiting for another promotion" in logs[v].read_text() for v in (a, b)):
            assert time.monotonic() < deadline, [logs[v].read_text()[-2000:] for v in (a, b)]
            assert all(p.poll() is None for p in procs), [logs[v].read_text() for v in (a, b)]
            time.sleep(0.2)
        assert registry.aliases() == {"production": first}  # nobody moved while we held it
    for p in procs:
        assert p.wait(timeout=120) == 0, [logs[v].read_text()[-2000:] for v in (a, b)]

    runs = [r for r in _promote_runs(cfg) if r.data.tags["tfmlops.promote.candidate"] in (a, b)]
    assert len(runs) == 2 and {r.data.tags["tfmlops.promote.outcome"] for r in runs} == {"promoted"}
    before = {r.data.tags["tfmlops.promote.candidate"]:
              r.data.tags["tfmlops.promote.production_before"] for r in runs}
    # Serialized: the second saw the first's result, not the production both started from.
    winner = a if before[a] == first else b
    loser = b if winner == a else a
    assert before == {winner: first, loser: winner}
    assert registry.aliases() == {"production": loser, "previous": winner}


def _promote_runs(cfg):
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    query = (f"tags.`tfmlops.stage` = 'promote' and "
             f"params.`promote.registered_model` = '{cfg.promote.registered_model}'")
    return client.search_runs([exp.experiment_id], query, order_by=["attributes.start_time ASC"])
