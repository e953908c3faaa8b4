"""`./dev`'s install: the `gpu` extra (tensorflow[and-cuda]) exactly when `nvidia-smi`
answers, installed from its own hashed lock (requirements-gpu.lock: every pin of
requirements.lock, plus the CUDA wheels), the lock file's hash in the install stamp, and
the one Python it supports. Checked on a copy of `dev`, pyproject.toml and the locks with
a stand-in `nvidia-smi` (and a stand-in venv Python that records what it is asked to
install): the install stamp `./dev` expects names the extras it chose, and
DEV_NO_INSTALL=1 stops it before any install when that stamp is missing. No CUDA wheel
is installed here (no GPU): the GPU lock is checked for consistency only."""

import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

LOCK = "requirements.lock"
GPU_LOCK = "requirements-gpu.lock"


def stamp_of(repo, extras: str = "test,beam", lock: str = LOCK) -> str:
    """The stamp of an install of `extras` from `lock`, as ./dev writes it."""
    text = (repo / "pyproject.toml").read_bytes() + (repo / lock).read_bytes()
    return hashlib.sha256(text + f"{extras}\n".encode()).hexdigest()[:16]


def copy_of_dev(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("dev", "pyproject.toml", LOCK, GPU_LOCK):
        shutil.copy2(ROOT / name, repo / name)
    return repo


def pins(lock: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{normalised name: (version, its hashes)} of a lock file; every entry has hashes."""
    text = (ROOT / lock).read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{64})+)",
                         text, re.MULTILINE)
    assert len(entries) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.MULTILINE))
    return {re.sub(r"[-_.]+", "-", name).lower(): (version, frozenset(re.findall(r"[0-9a-f]{64}",
                                                                             hashes)))
            for name, version, hashes in entries}


def dev_with(tmp_path, nvidia_smi_exit: int, repo=None) -> subprocess.CompletedProcess:
    repo = repo or copy_of_dev(tmp_path)
    (repo / ".venv").mkdir(exist_ok=True)
    (repo / ".venv" / f".installed-{stamp_of(repo)}").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
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
    repo = copy_of_dev(tmp_path)
    result = dev_with(tmp_path, nvidia_smi_exit=0, repo=repo)
    assert result.returncode == 3, result.stderr  # the test-only install does not do
    assert "does not match" in result.stderr and GPU_LOCK in result.stderr
    # What a GPU install stamps: the GPU lock with the gpu extra (not the CPU lock).
    (repo / ".venv" / f".installed-{stamp_of(repo, 'test,beam,gpu', GPU_LOCK)}").touch()
    assert dev_with(tmp_path, nvidia_smi_exit=0, repo=repo).returncode == 2


def test_a_gpu_machine_installs_only_hashed_pins_from_the_gpu_lock(tmp_path):
    """The install on a GPU machine, its pip calls recorded by a stand-in venv Python:
    every package from requirements-gpu.lock with --require-hashes, then the project
    alone; no call that resolves anything anew (the CUDA wheels used to be resolved at
    install time, without hashes, outside any lock: issue 47, L11)."""
    repo = copy_of_dev(tmp_path)
    calls = tmp_path / "pip-calls"
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    python.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "DEV_NO_INSTALL"}
    result = subprocess.run(["bash", str(repo / "dev"), "no-such-command"], cwd=repo,
                            env={**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "usage: ./dev" in result.stderr, result.stderr
    assert f"installing {GPU_LOCK} and tfmlops[test,beam,gpu]" in result.stderr
    first, *rest = calls.read_text().splitlines()
    assert first.startswith("-m pip install") and first.endswith(
        f"--require-hashes --no-deps -r {GPU_LOCK}"), first
    assert rest == ["-m pip install --quiet --disable-pip-version-check --no-deps "
                    "--no-build-isolation -e ."], rest
    assert (repo / ".venv" / f".installed-{stamp_of(repo, 'test,beam,gpu', GPU_LOCK)}").exists()


def test_the_gpu_lock_is_the_cpu_lock_plus_the_cuda_wheels_all_hashed():
    """Every pin of requirements.lock is in requirements-gpu.lock at its version and with
    its hashes (a GPU machine runs the tested stack), tensorflow[and-cuda]'s wheels are
    there too, and both were resolved by ./dev lock for the same Python and platform."""
    cpu, gpu = pins(LOCK), pins(GPU_LOCK)
    assert {name: cpu[name] for name in cpu} == {name: gpu.get(name) for name in cpu}
    extra = set(gpu) - set(cpu)
    assert extra and all(name.startswith("nvidia-") for name in extra), extra
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"} <= extra
    cpu_header, gpu_header = ((ROOT / lock).read_text().splitlines()[1] for lock in (LOCK, GPU_LOCK))
    assert gpu_header == cpu_header.replace("--extra beam", "--extra beam --extra gpu").replace(
        f"-o {LOCK}", f"-c {LOCK} -o {GPU_LOCK}")
    dev = (ROOT / "dev").read_text()
    assert "gpu_lock=requirements-gpu.lock" in dev and '-c "$lock" -o "$gpu_lock"' in dev


def test_the_gpu_extra_is_tensorflow_with_cuda_at_the_pinned_version():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (gpu,) = project["optional-dependencies"]["gpu"]
    (tf,) = [d for d in project["dependencies"] if d.startswith("tensorflow==")]
    assert gpu.startswith("tensorflow[and-cuda]")
    assert gpu.removeprefix("tensorflow[and-cuda]") == tf.removeprefix("tensorflow")


def test_a_changed_lock_file_is_a_new_install(tmp_path):
    repo = copy_of_dev(tmp_path)
    assert dev_with(tmp_path, nvidia_smi_exit=1, repo=repo).returncode == 2  # matches
    (repo / LOCK).write_text((repo / LOCK).read_text() + "# one more line\n")
    env = {**os.environ, "DEV_NO_INSTALL": "1"}
    result = subprocess.run(["bash", str(repo / "dev"), "test"], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "requirements.lock" in result.stderr


def test_dev_refuses_a_python_it_does_not_support(tmp_path):
    repo = copy_of_dev(tmp_path)
    fake = tmp_path / "python3.12"
    fake.write_text("#!/bin/sh\necho 3.12\n")
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(repo / "dev"), "test"], cwd=repo,
                            env={**os.environ, "PYTHON": str(fake)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "supports Python 3.11 only" in line and "is 3.12" in line


def test_the_supported_python_is_the_one_locked_and_the_one_running():
    """requires-python, ./dev's check, the lock's resolution and this interpreter agree."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11,<3.12"
    assert 'lock_python=3.11' in (ROOT / "dev").read_text()
    header = (ROOT / LOCK).read_text().splitlines()[1]
    assert "--python-version 3.11" in header and "--generate-hashes" in header
    assert sys.version_info[:2] == (3, 11)


def test_the_lock_pins_every_dependency_with_hashes():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / LOCK).read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{64})+)", text,
                         re.MULTILINE)
    pinned = {re.sub(r"[-_.]+", "-", name).lower() for name, _, _ in entries}
    assert len(entries) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.MULTILINE))
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", d).group()).lower()
             for d in wanted}
    assert names <= pinned, names - pinned
    assert "hypothesis" in pinned and "ruff" in pinned
