"""`./dev` installs the `gpu` extra (tensorflow[and-cuda]) exactly when `nvidia-smi`
answers (issue 16). Checked on a copy of `dev` and pyproject.toml with a stand-in
`nvidia-smi`: the install stamp `./dev` expects names the extras it chose, and
DEV_NO_INSTALL=1 stops it before any install when that stamp is missing."""

import hashlib
import os
import shutil
import subprocess

import pytest

from conftest import ROOT


def dev_with(tmp_path, nvidia_smi_exit: int) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(ROOT / "dev", repo / "dev")
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    # The stamp of an install of the `test` extra only, as ./dev writes it.
    stamp = hashlib.sha256((repo / "pyproject.toml").read_bytes() + b"test\n").hexdigest()[:16]
    (repo / ".venv").mkdir()
    (repo / ".venv" / f".installed-{stamp}").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nexit {nvidia_smi_exit}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "DEV_NO_INSTALL": "1"}
    return subprocess.run(["bash", str(repo / "dev"), "no-such-command"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)


def test_no_answering_gpu_keeps_the_plain_install(tmp_path):
    result = dev_with(tmp_path, nvidia_smi_exit=1)  # the tool is there, no driver answers
    assert result.returncode == 2, result.stderr  # past the install check, to the usage line
    assert "usage: ./dev" in result.stderr


def test_an_answering_gpu_asks_for_the_gpu_extra(tmp_path):
    result = dev_with(tmp_path, nvidia_smi_exit=0)
    assert result.returncode == 3, result.stderr  # the test-only install does not do
    assert "does not match" in result.stderr


def test_the_gpu_extra_is_tensorflow_with_cuda_at_the_pinned_version():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (gpu,) = project["optional-dependencies"]["gpu"]
    (tf,) = [d for d in project["dependencies"] if d.startswith("tensorflow==")]
    assert gpu.startswith("tensorflow[and-cuda]")
    assert gpu.removeprefix("tensorflow[and-cuda]") == tf.removeprefix("tensorflow")
