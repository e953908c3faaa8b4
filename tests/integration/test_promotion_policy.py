"""Production moves only through the gate or a person's recorded decision (issue 46), at
the stage's function level: a real MLflow registry (temp SQLite), a real git repository,
no model behind the versions (the gate reads export's tags: `promote.gate.evaluate:
false`). Plain `dvc repro` is `promote.run(cfg)` in the repository; `dvc repro` itself
runs in tests/e2e/test_promote_decisions.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import VENV_BIN, child_env, git, run_cli, stage_runs, tiny_params

pytestmark = pytest.mark.timeout(300)

GOOD = {"serving.accuracy": "0.99", "serving.bytes": "1000", "serving.latency_p50_ms": "1.0",
        "parity.passed": "true", "edge.top1_agreement": "1.0", "serving.runtime": "onnx"}


class Project:
    """A git repository on main with params.yaml committed, a registry, and export's
    registered.json written by `register`."""

    def __init__(self, root: Path, **promote):
        from tfmlops.config import load_config
        from tfmlops.registry import Registry

        self.root = root
        params = tiny_params(root, promote={"registered_model": "policy", "lock_lease_s": 5.0,
                                            "gate": {"evaluate": False}, **promote})
        params["paths"] = {k: str(Path(v).relative_to(root)) for k, v in params["paths"].items()}
        params["tracking"]["uri"] = f"sqlite:///{root / 'store' / 'mlflow.db'}"
        (root / "store").mkdir()
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        (root / "dvc.yaml").write_text("stages: {}\n")
        (root / ".gitignore").write_text("/store\n/models\n/reports\n/data\n")
        for args in (("init", "-q", "-b", "main"), ("config", "user.email", "t@example.invalid"),
                     ("config", "user.name", "tests")):
            git(*args, cwd=root)
        self.commit("params")
        self.cfg = load_config(root / "params.yaml")
        self.registry = Registry(self.cfg)
        self.made = 0

    def commit(self, message: str) -> str:
        git("add", "-A", cwd=self.root)
        git("commit", "-q", "--allow-empty", "-m", message, cwd=self.root)
        return self.head()

    def head(self) -> str:
        return git("rev-parse", "HEAD", cwd=self.root).strip()

    def register(self, accuracy: float = 0.99, commit: str | None = None, **tags) -> str:
        """A version as export registers it from `commit` (HEAD), named in registered.json."""
        self.made += 1
        version = self.registry.register(f"file:///nowhere/{self.made}", {
            **GOOD, "serving.accuracy": f"{accuracy:.4f}",
            "lineage.git_commit": commit or self.head(), **tags}, "test version")
        self.name_in_export(version)
        return version

    def name_in_export(self, version: str | None, model_uri: str | None = None) -> None:
        from tfmlops.artifacts import REGISTERED

        export = self.root / self.cfg.paths.export
        export.mkdir(parents=True, exist_ok=True)
        uri = model_uri or (self.registry.source(version) if version else None)
        (export / REGISTERED).write_text(json.dumps({
            "name": self.registry.name, "version": version, "model_uri": uri, "store": "this"}))

    def repro(self, cfg=None) -> dict:
        """What plain `dvc repro` runs: `tfmlops promote`."""
        from tfmlops.stages import promote

        return promote.run(cfg or self.cfg)

    def promote(self, **asked) -> dict:
        from tfmlops.stages import promote

        return promote.run(self.cfg, **asked)

    def production(self) -> str | None:
        return self.registry.alias("production")

    def decision(self) -> dict:
        return json.loads((self.root / "reports" / "promote.json").read_text())

    def ledger(self) -> list[dict]:
        from tfmlops.stages.promote.history import history

        return history(self.registry)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the checkout promote reads is the working directory's
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    return Project(tmp_path)


def test_a_rollback_holds_across_repro_until_a_version_from_a_later_commit(project):
    p = project
    v1 = p.register()
    assert p.repro()["outcome"] == "promoted"
    older = p.register(commit=p.head())  # registered before the rollback's commit exists
    p.commit("work")
    v2 = p.register()
    assert p.repro()["outcome"] == "promoted" and p.production() == v2
    assert p.promote(rollback=True, reason="v2 misroutes class 3")["production"] == v1

    held = p.repro()  # registered.json still names v2: the defect gave it back @production
    assert held["outcome"] == "held" and p.production() == v1
    assert f"version {v2} was taken out of production by" in p.decision()["summary"]
    assert "v2 misroutes class 3" in p.decision()["summary"]
    p.name_in_export(older)  # not removed, but registered before the rollback
    assert p.repro()["outcome"] == "held" and p.production() == v1
    assert "which does not contain it" in p.decision()["summary"]

    p.commit("a fix after the rollback")
    v3 = p.register()
    assert p.repro()["outcome"] == "promoted" and p.production() == v3
    assert p.promote(version=int(v2))["outcome"] == "promoted"  # a person brings v2 back
    moves = [(e["decision"], e["from"], e["to"]) for e in p.ledger() if e["moved"]]
    assert moves == [("gate", "-", v1), ("gate", v1, v2), ("rollback", v2, v1),
                     ("gate", v1, v3), ("gate", v3, v2)]


def test_a_forced_version_holds_across_repro(project):
    p = project
    v1 = p.register()
    p.repro()
    v2 = p.register()
    p.repro()
    forced = p.promote(version=int(v1), force=True, reason="incident 42")
    assert forced["outcome"] == "forced" and p.production() == v1
    assert p.repro()["outcome"] == "held" and p.production() == v1  # registered.json: v2
    entry = p.ledger()[-1]
    assert entry["decision"] == "forced" and entry["why"] == "incident 42" and entry["user"]
    assert p.promote(version=int(v2))["outcome"] == "promoted"


def test_only_committed_inputs_on_the_promotion_branch_promote(project):
    p = project
    v1 = p.register()
    p.repro()
    v2 = p.register(0.995)
    params = p.root / "params.yaml"
    params.write_text(params.read_text() + "# an uncommitted edit\n")
    assert p.repro()["outcome"] == "held"
    assert "uncommitted changes to params.yaml" in p.decision()["summary"]
    p.commit("edit")
    (p.root / "src" / "tfmlops").mkdir(parents=True)
    (p.root / "src" / "tfmlops" / "new.py").write_text("x = 1\n")  # untracked code
    assert p.repro()["outcome"] == "held"
    assert "src/tfmlops/new.py" in p.decision()["summary"]
    p.commit("code")
    (p.root / "dvc.lock").write_text("schema: '2.0'\n")  # DVC rewrites it during repro
    (p.root / "models" / "export" / "note.txt").write_text("an output")
    assert p.repro()["outcome"] == "promoted" and p.production() == v2

    git("checkout", "-q", "-b", "feature", cwd=p.root)
    p.register(0.999)
    assert p.repro()["outcome"] == "held" and p.production() == v2
    assert "on branch feature: plain `dvc repro` promotes from main only" in p.decision()["summary"]
    git("checkout", "-q", "--detach", cwd=p.root)
    assert p.repro()["outcome"] == "held" and "detached HEAD" in p.decision()["summary"]
    assert p.production() == v2 and v1 in [e["from"] for e in p.ledger()]


def test_an_older_checkout_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = Project(tmp_path, branches=["main", "old"])
    old = p.head()
    p.commit("later")
    p.register()
    p.repro()
    v2 = p.register(0.995)
    git("checkout", "-q", "-b", "old", old, cwd=p.root)  # behind what production came from
    assert p.repro()["outcome"] == "held"
    assert "does not contain commit" in p.decision()["summary"] and p.production() != v2
    git("checkout", "-q", "main", cwd=p.root)
    assert p.repro()["outcome"] == "promoted" and p.production() == v2


def test_an_alias_moved_outside_is_detected_held_then_adopted_or_released(project):
    p = project
    v1 = p.register()
    p.repro()
    v2 = p.register(0.995)
    p.registry.client.set_registered_model_alias(p.registry.name, "production", v2)  # the UI
    assert p.repro()["outcome"] == "held" and p.production() == v2
    summary = p.decision()["summary"]
    assert "moved outside tfmlops from version 1 to 2" in summary and "--adopt" in summary
    assert p.repro()["outcome"] == "held"  # recorded once, not at every repro
    assert [e["decision"] for e in p.ledger()].count("moved_from_outside") == 1

    assert p.promote(adopt=True, reason="hotfix by ops")["outcome"] == "adopted"
    v3 = p.register(0.97)  # worse than the adopted v2 (tags): gated against it
    assert p.repro()["outcome"] == "refused" and p.production() == v2

    p.registry.client.set_registered_model_alias(p.registry.name, "production", v1)
    assert p.repro()["outcome"] == "held"
    assert p.promote(release=True)["outcome"] == "released" and p.production() == v2
    with pytest.raises(Exception, match="nothing to release"):
        p.promote(release=True)
    plain = p.registry.register("file:///nowhere/other", {"note": "not ours"}, "another client's")
    p.registry.client.set_registered_model_alias(p.registry.name, "production", plain)
    p.repro()
    with pytest.raises(Exception, match="is not a tfmlops serving model"):
        p.promote(adopt=True)
    assert p.promote(release=True)["production"] == v2
    assert p.registry.alias("candidate") == v3  # refused against the adopted v2 above


def test_an_existing_production_without_a_ledger_is_adopted_at_upgrade(project):
    p = project
    v1 = p.register()
    p.registry.set_alias("production", v1)  # promoted by an older tfmlops
    assert p.repro()["outcome"] == "unchanged"
    assert [e["decision"] for e in p.ledger()] == ["found_at_upgrade"]
    v2 = p.register(0.995)
    assert p.repro()["outcome"] == "promoted" and p.production() == v2


def test_approval_required_then_approve_reject_and_a_regate(tmp_path, monkeypatch):
    from tfmlops.errors import DataError

    monkeypatch.chdir(tmp_path)
    p = Project(tmp_path, approval="required")
    v1 = p.register()
    assert p.repro()["outcome"] == "awaiting_approval" and p.production() is None
    assert p.registry.aliases() == {"awaiting-approval": v1}
    again = p.repro()
    assert again["outcome"] == "awaiting_approval" and again["already_decided"]
    assert p.promote(approve=int(v1), reason="reviewed the evaluation")["outcome"] == "approved"
    assert p.registry.aliases() == {"production": v1}

    v2 = p.register()
    p.repro()
    rejected = p.promote(reject=int(v2), reason="trained on the wrong labels")
    assert rejected["outcome"] == "rejected" and p.registry.aliases() == {"production": v1}
    assert p.repro()["outcome"] == "held" and "rejected" in p.decision()["summary"]
    with pytest.raises(DataError, match="rejected it"):
        p.promote(approve=int(v2), reason="changed my mind")

    worse = p.register(0.90)
    assert p.repro()["outcome"] == "refused"
    with pytest.raises(DataError, match=f"moves only with `tfmlops promote --version {worse} --force`"):
        p.promote(approve=int(worse), reason="ship it")

    v4 = p.register()
    assert p.repro()["outcome"] == "awaiting_approval"  # evaluated against v1
    forced = p.register(0.999)
    p.promote(version=int(forced), force=True)
    approved = p.promote(approve=int(v4), reason="ok")  # production changed: gated again
    assert approved["outcome"] == "approved" and p.production() == v4
    assert "gated again" in p.ledger()[-1]["why"]
    assert {e["user"] for e in p.ledger()} != {""}


def test_tracking_off_and_nothing_registered_exit_0(project):
    p = project
    params = yaml.safe_load((p.root / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    (p.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = run_cli("promote", cwd=p.root)
    assert "tracking is off" in proc.stderr and json.loads(proc.stdout)["outcome"] == "skipped"

    params["tracking"]["enabled"] = True
    (p.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    p.name_in_export(None)
    proc = run_cli("promote", cwd=p.root)
    assert "nothing registered" in proc.stderr and json.loads(proc.stdout)["outcome"] == "skipped"


def test_a_version_of_another_store_holds(project):
    p = project
    p.register()
    p.repro()
    p.name_in_export("1", model_uri="file:///a/teammates/own/store/model")
    assert p.repro()["outcome"] == "held"
    assert "registered.json names version 1 of this, not of this store's" in p.decision()["summary"]
    p.name_in_export("7", model_uri="file:///elsewhere")  # no such version here at all
    assert p.repro()["outcome"] == "held"


def test_a_deleted_production_and_a_renamed_model(project):
    from tfmlops.config import load_config
    from tfmlops.registry import Registry
    from tfmlops.stages.promote.history import history

    p = project
    p.register()
    p.repro()
    v2 = p.register(0.995)
    p.repro()
    p.registry.client.delete_model_version(p.registry.name, v2)  # its alias goes with it
    assert p.repro()["outcome"] == "held"
    assert "to none (deleted)" in p.decision()["summary"]
    assert p.promote(adopt=True)["production"] is None
    v3 = p.register()
    assert p.repro()["outcome"] == "promoted" and p.production() == v3

    params = yaml.safe_load((p.root / "params.yaml").read_text())
    params["promote"]["registered_model"] = "policy-renamed"
    (p.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    p.commit("rename the model")
    renamed = load_config(p.root / "params.yaml")
    other = Registry(renamed)
    version = other.register("file:///nowhere/renamed", {**GOOD, "lineage.git_commit": p.head()}, "t")
    (p.root / "models" / "export" / "registered.json").write_text(json.dumps(
        {"name": other.name, "version": version, "model_uri": other.source(version)}))
    assert p.repro(renamed)["outcome"] == "promoted"  # a new model: its first version
    assert [e["decision"] for e in history(other)] == ["gate"]


def test_a_decided_candidate_is_not_evaluated_again_and_a_noop_needs_no_mlflow(project):
    p = project
    p.register()
    p.repro()
    p.register(0.90)
    assert p.repro()["outcome"] == "refused"
    runs = len(stage_runs(p.cfg, "promote"))
    again = p.repro()  # answered from reports/promote/decided.json: promote.json unchanged
    assert again["outcome"] == "refused" and again["already_decided"]
    assert len(stage_runs(p.cfg, "promote")) == runs  # no run, no evaluation
    probe = ("import sys; from tfmlops.cli import main; code = main(['promote']); "
             "print('mlflow' in sys.modules, code)")
    proc = subprocess.run([str(VENV_BIN / "python"), "-c", probe], cwd=p.root, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split()[-2:] == ["False", "0"], proc.stderr[-3000:]
    assert "already decided: refused" in proc.stderr

    params = yaml.safe_load((p.root / "params.yaml").read_text())
    params["promote"]["gate"]["min_accuracy"] = 0.85  # the gate changed: decided again
    (p.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    p.commit("a lower floor")
    from tfmlops.config import load_config

    assert p.repro(load_config(p.root / "params.yaml"))["outcome"] == "refused"
    assert len(stage_runs(p.cfg, "promote")) == runs + 1  # evaluated again (worse than 0.99)


@given(steps=st.lists(st.sampled_from(["new_better", "new_worse", "outside", "edit_params",
                                        "commit", "rollback", "store_write", "nothing"]),
                      min_size=1, max_size=5))
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_a_remembered_decision_equals_a_cold_one(tmp_path_factory, steps):
    """reports/promote/decided.json answers a plain repro without reading the store. After
    any sequence of what changes a decision (a new version, an alias moved in the UI, an
    uncommitted edit, a commit, a rollback, an unrelated write to the store), the answer
    it gives (warm) is the one promote gives with the file removed (cold)."""
    import os

    from tfmlops.errors import DataError
    from tfmlops.stages.promote.decided import FILE

    root = tmp_path_factory.mktemp("remembered")
    here = os.getcwd()
    os.chdir(root)
    try:
        p = Project(root)
        p.register()
        p.repro()
        for step in steps:
            if step.startswith("new_"):
                p.commit("work")
                p.register(0.995 if step == "new_better" else 0.9)
            elif step == "outside":
                p.registry.client.set_registered_model_alias(p.registry.name, "production", "1")
            elif step == "edit_params":
                (root / "params.yaml").write_text((root / "params.yaml").read_text() + "#\n")
            elif step == "commit":
                p.commit("step")
            elif step == "rollback":
                try:
                    p.promote(rollback=True)
                except DataError:
                    pass  # no @previous yet
            elif step == "store_write":
                p.registry.set_model_tag("note", step)
            warm = p.repro()
            (root / "reports" / "promote" / FILE).unlink()
            cold = p.repro()
            assert cold["production"] == warm["production"], (steps, warm, cold)
            moved = warm["outcome"] in ("promoted", "unchanged")
            assert cold["outcome"] == ("unchanged" if moved else warm["outcome"]), (steps, warm, cold)
    finally:
        os.chdir(here)


# A promotion paused (SIGSTOP) between its lock check and its alias write: the residual
# of review L4 that no lock without a conditional write can close. It resumes after a
# waiter broke its lease and promoted, and its write lands late.
PAUSED_WRITER = """
import os, signal, sys
from tfmlops.config import load_config
from tfmlops.registry import Registry
registry = Registry(load_config(sys.argv[1]))
with registry.promotion_lock() as check:
    check()
    print("checked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    registry.client.set_registered_model_alias(registry.name, "production", sys.argv[2])
    check()
"""


def test_a_late_write_after_the_lock_was_broken_is_recorded_and_holds(project):
    import signal

    p = project
    p.register()
    assert p.repro()["outcome"] == "promoted"
    late = p.register(0.995)
    paused = subprocess.Popen([str(VENV_BIN / "python"), "-c", PAUSED_WRITER, str(p.root / "params.yaml"),
                               late], cwd=p.root, env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert paused.stdout.readline().strip() == "checked"
        v3 = p.register(0.996)
        assert p.repro()["outcome"] == "promoted" and p.production() == v3  # broke the lease
    finally:
        paused.send_signal(signal.SIGCONT)
    err = paused.communicate(timeout=120)[1]
    assert paused.returncode != 0 and "lost the promotion lock" in err  # it says so itself
    assert p.production() == late
    assert p.repro()["outcome"] == "held"  # and the next promotion records and holds it
    assert f"moved outside tfmlops from version {v3} to {late}" in p.decision()["summary"]
