"""Issue 46's defects, literally, through real `dvc repro` in a scratch git repository:
only the promote stage (as test_dvc_exp_promote.py does), versions registered by the test
with export's tags (no model behind them: `promote.gate.evaluate: false`) and named in
export's registered.json, as `dvc repro export` leaves it. Each step failed on b0a5723:
a rollback or a forced version was undone by the next repro, an uncommitted workspace or
an older checkout promoted, and the gate had no approval step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import dvc, git, relative_tiny_params, run_cli, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GOOD = {"serving.accuracy": "0.99", "serving.bytes": "1000", "serving.latency_p50_ms": "1.0",
        "parity.passed": "true", "edge.top1_agreement": "1.0", "serving.runtime": "onnx"}

DVC_YAML = """stages:
  promote:
    cmd: tfmlops promote
    always_changed: true
    params:
      - promote
      - tracking.enabled
    outs:                               # cached, as in the project's dvc.yaml
      - reports/promote.json
    metrics:
      - reports/metrics/promote.json
"""


class Repo:
    def __init__(self, root: Path, store: Path):
        from tfmlops.config import load_config
        from tfmlops.registry import Registry

        params = relative_tiny_params(promote={"registered_model": "decisions",
                                               "gate": {"evaluate": False}})
        params["tracking"]["uri"] = f"sqlite:///{store / 'mlflow.db'}"
        store.mkdir()
        self.root = scratch_repo(root, params)
        (self.root / "dvc.yaml").write_text(DVC_YAML)
        self.commit("promote only")
        self.registry = Registry(load_config(self.root / "params.yaml"))

    def commit(self, message: str) -> None:
        git("add", "-A", cwd=self.root)
        git("commit", "-q", "--allow-empty", "-m", message, cwd=self.root)

    def export(self, accuracy: float = 0.99) -> str:
        """A version registered from HEAD, named in models/export/registered.json."""
        head = git("rev-parse", "HEAD", cwd=self.root).strip()
        version = self.registry.register(f"file:///nowhere/{accuracy}-{head}", {
            **GOOD, "serving.accuracy": str(accuracy), "lineage.git_commit": head}, "test")
        self.name(version)
        return version

    def name(self, version: str) -> None:
        export = self.root / "models" / "export"
        export.mkdir(parents=True, exist_ok=True)
        (export / "registered.json").write_text(json.dumps({
            "name": self.registry.name, "version": version,
            "model_uri": self.registry.source(version)}))

    def repro(self) -> dict:
        proc = dvc("repro", cwd=self.root)
        decision = json.loads((self.root / "reports" / "promote.json").read_text())
        return {**decision, "log": proc.stdout + proc.stderr}

    def production(self) -> str | None:
        return self.registry.alias("production")

    def tfmlops(self, *args: str) -> str:
        return run_cli(*args, cwd=self.root).stderr


def test_production_moves_only_through_the_gate_or_a_recorded_decision(tmp_path):
    r = Repo(tmp_path / "repo", tmp_path / "store")
    v1 = r.export()
    assert r.repro()["outcome"] == "promoted" and r.production() == v1
    r.commit("work")
    v2 = r.export()
    assert r.repro()["outcome"] == "promoted" and r.production() == v2

    # 1. a rollback holds across `dvc repro` (b0a5723: v2 was back 4 seconds later)
    r.tfmlops("promote", "--rollback", "--reason", "v2 misroutes class 3")
    assert r.production() == v1
    held = r.repro()
    assert held["outcome"] == "held" and r.production() == v1
    assert f"version {v2} was taken out of production" in held["log"]

    # ... and so does a forced version
    r.tfmlops("promote", "--version", v2, "--force", "--reason", "the rollback was wrong")
    r.name(v1)  # an older export names v1, which the forced version replaced
    assert r.repro()["outcome"] == "held" and r.production() == v2

    # 2. an uncommitted workspace holds; the same change committed is gated
    params = yaml.safe_load((r.root / "params.yaml").read_text())
    params["promote"]["gate"]["min_accuracy"] = 0.9
    (r.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    v3 = r.export(0.995)
    held = r.repro()
    assert held["outcome"] == "held" and "uncommitted changes to params.yaml" in held["log"]
    assert r.production() == v2
    r.commit("a lower accuracy floor")
    v4 = r.export(0.995)  # registered from the commit that contains the forced decision
    assert r.repro()["outcome"] == "promoted" and r.production() == v4

    # ... and so does an older checkout
    r.commit("what the repro wrote")  # dvc.lock
    first = git("rev-list", "--max-parents=0", "HEAD", cwd=r.root).strip()
    git("checkout", "-q", "-f", first, cwd=r.root)
    r.name(v3)
    assert r.repro()["outcome"] == "held" and r.production() == v4
    git("checkout", "-q", "-f", "main", cwd=r.root)

    # 3. a worse candidate is refused (here: below the floor on export's tags)
    worse = r.export(0.85)
    refused = r.repro()
    assert refused["outcome"] == "refused" and r.production() == v4
    again = r.repro()  # decided: not evaluated again, and says so in one line
    assert "already decided" in again["log"] and r.production() == v4

    # an outside alias move is detected, recorded, and held until a person decides
    r.registry.client.set_registered_model_alias(r.registry.name, "production", v1)
    outside = r.repro()
    assert outside["outcome"] == "held" and "moved outside tfmlops" in outside["log"]
    r.tfmlops("promote", "--release", "--reason", "not ours")
    assert r.production() == v4

    # approval: required in the committed params; approve and reject by version
    params["promote"]["approval"] = "required"
    (r.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r.commit("approval required")
    v6 = r.export()
    assert r.repro()["outcome"] == "awaiting_approval" and r.production() == v4
    r.tfmlops("approve", v6, "--reason", "looked at the confusion matrix")
    assert r.production() == v6
    v7 = r.export()
    assert r.repro()["outcome"] == "awaiting_approval"
    r.tfmlops("reject", v7, "--reason", "trained on last week's labels")
    assert r.repro()["outcome"] == "held" and r.production() == v6

    rows = json.loads(run_cli("history", "--json", cwd=r.root).stdout.splitlines()[-1])
    moved = [(row["decision"], row["to"]) for row in rows if row["moved"]]
    assert moved == [("gate", v1), ("gate", v2), ("rollback", v1), ("forced", v2),
                     ("gate", v4), ("moved_from_outside", v1), ("release", v4),
                     ("approval", v6)]
    assert worse not in [to for _, to in moved]

    # 4. tracking off: promote says so in one line and `dvc repro` passes
    params["tracking"]["enabled"] = False
    (r.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    off = r.repro()
    assert off["outcome"] == "skipped" and "tracking is off" in off["log"]
