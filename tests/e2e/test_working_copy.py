"""The suite does not depend on the user's working copy: after the state-changing blocks of
the README and docs/ (an accepted reference profile, committed; the team block's DVC
remote, committed; an experiment's params left in the workspace with DVC_EXP_NAME set,
as `dvc exp run` leaves them for its stages), the fast tier passes in that copy.

The copy is this checkout (its code as it is now, git history included); the blocks are
read from README.md and docs/*.md, so a change to them is what runs here. `dvc exp run`'s pipeline is
not run (minutes on digits): what it leaves for the tests to trip on, a params.yaml
changed in the workspace and DVC_EXP_NAME in its stages' environment, is set directly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from test_readme import doc_blocks

from conftest import ROOT, VENV_BIN, git

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

HEAVY = {".venv", "data", "models", "reports", "mlruns", "mlartifacts", "mlflow.db",
         ".tfmlops", ".pytest_cache", ".hypothesis", ".ruff_cache", "request.json"}


def doc_lines(containing: str) -> list[str]:
    """The command lines of the README and docs/ that contain `containing` (comments
    dropped)."""
    return [line.split("  #")[0].strip() for _, _, block in doc_blocks()
            for line in block.splitlines()
            if containing in line and not line.lstrip().startswith("#")]


def copy_checkout(dest):
    def ignore(folder, names):
        top = os.path.samefile(folder, ROOT)
        return [n for n in names if n == "__pycache__" or (top and n in HEAVY)
                or (os.path.samefile(folder, ROOT / ".dvc") and n in ("cache", "tmp"))]

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    (dest / "data").mkdir()
    shutil.copy2(ROOT / "data" / "reference_profile.json", dest / "data" / "reference_profile.json")
    return dest


def sh(command: str, cwd, env) -> str:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_fast_tier_passes_after_the_readmes_state_changing_blocks(tmp_path):
    copy = copy_checkout(tmp_path / "checkout")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1"}
    git("add", "-A", cwd=copy)  # the checkout's own uncommitted work, as the user has it
    git("commit", "-q", "--allow-empty", "-m", "the checkout as it is", cwd=copy)

    # An accepted reference profile, committed (docs/data-contract.md).
    sh("tfmlops materialize && tfmlops prepare", copy, env)
    (accept,) = doc_lines("tfmlops accept-reference")
    (commit,) = doc_lines("git add data/reference_profile.json")
    sh(f"{accept} && {commit}", copy, env)
    accepted = yaml.safe_load((copy / "data" / "reference_profile.json").read_text())
    assert "by_split_class" in accepted

    # The team block's remote, committed (docs/scaling.md, "A team": the one line that adds
    # the remote and commits it; "A DVC remote" adds it alike and commits on the next line).
    (remote,) = doc_lines('dvc remote add -d storage /mnt/team/dvc-store && git commit')
    sh(remote.replace("/mnt/team/dvc-store", str(tmp_path / "team-store")), copy, env)
    assert "storage" in sh("dvc remote list", copy, env)

    # An experiment's params in the workspace, and its name in the environment.
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["train"]["epochs"] = params["train"]["epochs"] + 7
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env["DVC_EXP_NAME"] = "users-exp"

    # Its own --basetemp: pytest keeps only the 3 newest numbered folders under the shared
    # /tmp/pytest-of-<user>, so a nested run there would delete the outer run's live ones.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-x",
                           "-p", "no:cacheprovider", "--durations=5", "-n", "2",
                           "--basetemp", str(tmp_path / "inner")],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=2100)
    tail = proc.stdout[-4000:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert proc.returncode == 0, "\n".join(failed) + "\n" + proc.stdout[:6000]
    assert re.search(r"\d+ passed", tail), tail
