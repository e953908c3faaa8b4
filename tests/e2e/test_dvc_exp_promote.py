"""A real `dvc exp run` of `promote` (issue 14, item 3): the experiment's version gets
@exp-<name>; @production only moves under plain `dvc repro`."""

import json
from pathlib import Path

import pytest

from conftest import dvc, git, relative_tiny_params, repo_copy, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GOOD = {"serving.accuracy": "0.99", "serving.bytes": "1000", "serving.latency_p50_ms": "1.0",
        "parity.passed": "true", "edge.top1_agreement": "1.0"}

# Only the promote stage, of a version registered by the test: no training needed.
DVC_YAML = """stages:
  promote:
    cmd: tfmlops promote --version {version}
    params:
      - promote
    outs:                               # cached, as in the project's dvc.yaml
      - reports/promote.json
    metrics:
      - reports/metrics/promote.json
"""


def test_dvc_exp_run_never_moves_production(tmp_path):
    from tfmlops.config import load_config
    from tfmlops.registry import Registry

    # No model behind the versions: the gate reads their tags alone (no evaluation).
    params = relative_tiny_params(promote={"registered_model": "exp-promote",
                                           "gate": {"evaluate": False}})
    params["tracking"]["uri"] = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    repo = scratch_repo(tmp_path / "repo", params)
    registry = Registry(load_config(repo / "params.yaml"))
    v1, v2 = (registry.register(f"file:///nowhere/{i}", GOOD, "test") for i in (1, 2))
    (repo / "dvc.yaml").write_text(DVC_YAML.format(version=v1))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "promote only", cwd=repo)
    dvc("repro", cwd=repo)
    assert registry.aliases() == {"production": v1}

    (repo / "dvc.yaml").write_text(DVC_YAML.format(version=v2))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "promote v2", cwd=repo)
    dvc("exp", "run", "-n", "try-gate", "-S", "promote.gate.min_accuracy=0.9", cwd=repo)
    assert registry.aliases() == {"production": v1, "exp-try-gate": v2}
    decision = json.loads((Path(repo) / "reports" / "promote.json").read_text())
    assert decision["experiment"] == "try-gate" and decision["outcome"] == "held"
    assert "experiments never move @production" in decision["reason"]

    git("checkout", "-q", "--", "params.yaml", "dvc.lock", cwd=repo)  # the experiment, dropped
    dvc("repro", cwd=repo)  # plain repro promotes as before
    assert registry.alias("production") == v2


@pytest.mark.timeout(1800)  # the first user of the session's pipeline_repo builds it
def test_an_applied_and_committed_experiment_reaches_production_on_dvc_repro(pipeline_repo,
                                                                             tmp_path,
                                                                             monkeypatch):
    """The path the README and the experiment's own log line describe, literally, on a copy
    of the whole pipeline's repo: `dvc exp run -S export.latency_runs=151`, `dvc exp
    apply`, `git commit`, `dvc repro`, then the aliases. Promote's deps do not change, so
    only its `always_changed` runs it."""
    from tfmlops.config import load_config
    from tfmlops.registry import Registry

    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "the pipeline's first run", cwd=repo)
    monkeypatch.chdir(repo)  # the params' relative store is the copy's
    registry = Registry(load_config(repo / "params.yaml"))
    before = registry.alias("production")
    assert before is not None

    # 151, not the README's 150: a value of this test's own, whatever the README shows.
    dvc("exp", "run", "-S", "export.latency_runs=151", cwd=repo)
    (name,) = dvc("exp", "list", "--name-only", cwd=repo).stdout.split()
    exp_version = registry.alias(f"exp-{name}")
    assert exp_version not in (None, before) and registry.alias("production") == before
    dvc("exp", "apply", name, cwd=repo)
    held = dvc("repro", cwd=repo)  # applied, not committed: not promoted (issue 46)
    assert "uncommitted changes to params.yaml" in held.stdout + held.stderr
    assert registry.alias("production") == before
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", f"apply {name}", cwd=repo)
    dvc("repro", cwd=repo)
    assert registry.alias("production") == exp_version
    assert registry.alias("previous") == before
    # A further repro runs promote alone, which does nothing: test_readme checks that.


@pytest.mark.timeout(1800)
def test_a_committed_training_change_is_gated_and_promoted_by_dvc_repro(pipeline_repo, tmp_path,
                                                                        monkeypatch):
    """Issue 46: the committed-work rule holds an uncommitted workspace, not a committed
    change: `train.epochs` raised and committed, then plain `dvc repro` retrains, exports,
    and the gate compares the better model with production on the same images."""
    import yaml

    from tfmlops.config import load_config
    from tfmlops.registry import Registry

    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "the pipeline's first run", cwd=repo)
    monkeypatch.chdir(repo)
    registry = Registry(load_config(repo / "params.yaml"))
    before = registry.alias("production")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["epochs"] = 8  # from TINY's 2: a clearly better model
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git("commit", "-q", "-am", "train longer", cwd=repo)
    proc = dvc("repro", cwd=repo, timeout=1500)
    decision = json.loads((repo / "reports" / "promote.json").read_text())
    assert decision["outcome"] == "promoted", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert registry.alias("production") not in (None, before)
    paired = decision["evaluation"]["paired"]
    assert paired["candidate_only"] > paired["production_only"]
