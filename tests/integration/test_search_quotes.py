"""Names with quotes in MLflow searches, on a real SQLite store: the registry's
idempotent registration and `tfmlops history` find what they wrote whatever the
registered model is called (MLflow strips a filter value's quotes without unescaping
it, so a backslash-escaped quote searched for a name with a backslash in it)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfmlops.config import ConfigError, replace
from tfmlops.tracking.naming import equals

GOOD = {"serving.accuracy": "0.99", "serving.bytes": "1000"}
# Model names MLflow accepts, quotes of one kind included (both kinds: refused by the config).
NAMES = st.text(st.sampled_from("ab'\" -_é"), min_size=1, max_size=8).filter(
    lambda n: n.strip() and not ("'" in n and '"' in n))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES)
def test_a_keyed_registration_is_found_again_under_any_name(make_cfg, name):
    from tfmlops.registry import Registry

    cfg = make_cfg()
    registry = Registry(replace(cfg, promote=replace(cfg.promote, registered_model=name)))
    first = registry.register("file:///nowhere/keyed", GOOD, "test", key=f"run:{name}")
    # The same key again is the same version (it registered a second one when the
    # search for the key missed the name).
    assert registry.register("file:///nowhere/keyed", GOOD, "test", key=f"run:{name}") == first
    assert len(registry.client.search_model_versions(equals("name", name))) == 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=NAMES)
def test_stage_runs_finds_a_run_by_a_param_with_quotes(make_cfg, value):
    from conftest import mlflow_client
    from tfmlops.tracking import stage_runs

    cfg = make_cfg()
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(cfg.tracking.experiment)
    run = client.create_run(exp_id, tags={"tfmlops.stage": "promote"})
    client.log_param(run.info.run_id, "promote.registered_model", value)
    found = stage_runs(cfg, "promote", params={"promote.registered_model": value})
    assert run.info.run_id in [r["run_id"] for r in found]
    assert all(client.get_run(r["run_id"]).data.params["promote.registered_model"] == value
               for r in found)


@pytest.mark.parametrize("name", ["a/b", "a:b", "bob's \"model\""])
def test_a_model_name_mlflow_cannot_register_or_search_is_refused_in_one_line(make_cfg, name):
    with pytest.raises(ConfigError, match="promote.registered_model") as err:
        make_cfg(promote={"registered_model": name})
    assert "\n" not in str(err.value)


def test_equals_picks_the_quote_the_value_does_not_hold():
    assert equals("name", "bob") == "name = 'bob'"
    assert equals("name", "bob's") == "name = \"bob's\""
    with pytest.raises(ValueError):
        equals("name", "'\"")
