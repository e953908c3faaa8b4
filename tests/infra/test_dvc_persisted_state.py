"""A killed search's or training's resume state survives the DVC commands a user runs
next. paths.tuner and paths.backup are persisted, cached DVC outputs (cached so a
teammate's clone pulls them); DVC must then never replace their unsaved files on its own:
`dvc checkout` refuses without --force and `dvc repro` keeps them. Shown on a one-stage
pipeline declared as dvc.yaml declares those two folders."""

import subprocess

import pytest
import yaml

from conftest import ROOT, dvc, git

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]


def persisted_outputs() -> dict:
    """{stage: [output]} of every `persist: true` output in the project's dvc.yaml."""
    found = {}
    for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        for out in stage.get("outs", []):
            if isinstance(out, dict) and next(iter(out.values())).get("persist"):
                found.setdefault(name, []).append(next(iter(out)))
    return found


def test_the_project_persists_only_resume_state_and_caches_it():
    assert persisted_outputs() == {"tune": ["${paths.tuner}"], "train": ["${paths.backup}"]}
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        for out in stage.get("outs", []):
            opts = next(iter(out.values())) if isinstance(out, dict) else {}
            assert opts.get("cache", True), out  # pushed to a remote, so a clone has it


def test_unsaved_resume_state_survives_checkout_and_repro(tmp_path):
    git("init", "-q", cwd=tmp_path)
    dvc("init", "-q", cwd=tmp_path)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: mkdir -p backup && echo done > model.txt\n"
        "    outs:\n      - model.txt\n      - backup:\n          persist: true\n")
    dvc("repro", cwd=tmp_path)
    git("add", "-A", cwd=tmp_path)
    git("commit", "-q", "-m", "a finished run: its (empty) backup cached", cwd=tmp_path)
    state = tmp_path / "backup" / "latest.weights.h5"
    state.write_text("epoch 3 of a killed run")

    refused = dvc("checkout", cwd=tmp_path, check=False)
    assert refused.returncode != 0 and "--force" in refused.stderr + refused.stdout
    assert state.read_text() == "epoch 3 of a killed run"
    dvc("repro", cwd=tmp_path)
    assert state.read_text() == "epoch 3 of a killed run"
    assert subprocess.run(["git", "status", "--porcelain", "backup"], cwd=tmp_path,
                          capture_output=True, text=True).stdout == ""  # DVC's, not git's
