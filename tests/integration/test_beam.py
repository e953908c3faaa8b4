"""prepare on Apache Beam (data.engine: beam) writes the local path's data/prepared byte
for byte, on Beam's in-process runner with 2 worker processes and on a cluster's
topology (a portable job service and an external SDK worker pool, each its own process
on 127.0.0.1, sharing nothing with this one but the filesystem); a worker killed
mid-run fails prepare in one line with nothing swapped in; a bad option exits 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import child_env, free_port, run_cli, tiny_params
from images import photo_folder

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # Beam runners, job services, moto

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
              "--direct_num_workers=2"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Three classes of small photos with what a real folder holds: corrupt files, one
    photo twice in a class, one in two classes, a symlink out of the folder."""
    root = tmp_path_factory.mktemp("beam") / "photos"
    files = photo_folder(root, per_class=8, classes=3)
    (root / "c0" / "empty.jpg").write_bytes(b"")
    (root / "c1" / "cut.jpg").write_bytes(files[9].read_bytes()[:200])
    (root / "c2" / "notes.txt").write_bytes(b"not an image\n")
    shutil.copy(files[0], root / files[0].parent.name / "again.jpg")
    other = sorted(p for p in root.iterdir() if p.is_dir() and p != files[5].parent)[0]
    shutil.copy(files[5], other / "also_here.jpg")
    outside = root.parent / "outside.jpg"
    shutil.copy(files[1], outside)
    (root / files[1].parent.name / "link.jpg").symlink_to(outside)
    return root


def prepare(work: Path, images: Path, engine: str, options=None, env=None, beam=None):
    """`tfmlops prepare` in its own process (`beam`: more of data.beam); (the
    CompletedProcess, the config, or None for params the stage refused)."""
    from tfmlops.config import ConfigError, load_config

    work.mkdir(parents=True, exist_ok=True)
    data = {"image_dir": str(images), "channels": 3, "image_size": 16, "shards": 3,
            "split": {"val": 0.2, "test": 0.2}, "max_bad_fraction": 0.3, "engine": engine}
    if options is not None:
        data["beam"] = {"options": options, **(beam or {})}
    params = tiny_params(work, data=data, tracking={"enabled": False})
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_cli("--params", str(work / "params.yaml"), "prepare", cwd=work,
                     env={**child_env(), **(env or {})}, check=False)
    try:
        return result, load_config(work / "params.yaml")
    except ConfigError:
        return result, None


def prepared_bytes(cfg) -> dict[str, bytes]:
    out = Path(cfg.paths.prepared)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_output(images, tmp_path_factory) -> dict[str, bytes]:
    result, cfg = prepare(tmp_path_factory.mktemp("local"), images, "local")
    assert result.returncode == 0, result.stderr
    return prepared_bytes(cfg)


def test_the_in_process_runner_writes_the_local_bytes(images, local_output, tmp_path):
    result, cfg = prepare(tmp_path, images, "beam", IN_PROCESS)
    assert result.returncode == 0, result.stderr
    assert prepared_bytes(cfg) == local_output
    # the stage's own lines only: Beam's workers log their lives into reports/prepare/
    assert [line for line in result.stderr.splitlines()
            if not line.startswith("prepare: ")] == [], result.stderr
    names = set(local_output)
    assert {"manifest.json", "stats.json", "quarantine.json"} <= names
    assert any(n.startswith("quarantine/") for n in names)  # the corrupt files' copies
    for split in ("train", "val", "test"):  # shards by content hash: empty ones are dropped
        assert 1 <= sum(n.startswith(f"{split}-") for n in names) <= 3


@pytest.fixture
def beam_cluster(tmp_path):
    """A portable job service and an external SDK worker pool, each its own process."""
    job, pool = free_port(), free_port()
    env = {**child_env(), "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", module, flag, str(port)], env=env,
                              stdout=open(tmp_path / f"{name}.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
             for name, module, flag, port in (
                 ("job", "apache_beam.runners.portability.local_job_service_main", "--port", job),
                 ("pool", "apache_beam.runners.worker.worker_pool_main", "--service_port", pool))]
    try:
        for port in (job, pool):
            _wait_for_port(port, procs)
        yield {"job": job, "pool": pool, "procs": procs}
    finally:
        for proc in procs:
            with_group(proc, signal.SIGKILL)
            proc.wait(30)


def with_group(proc: subprocess.Popen, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_for_port(port: int, procs, timeout: float = 60) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        assert all(p.poll() is None for p in procs), "a Beam service exited at start"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


def portable(cluster) -> list[str]:
    return ["--runner=PortableRunner", f"--job_endpoint=localhost:{cluster['job']}",
            "--environment_type=EXTERNAL", f"--environment_config=localhost:{cluster['pool']}"]


def test_a_job_service_and_an_external_worker_pool_write_the_local_bytes(
        images, local_output, tmp_path, beam_cluster):
    # a remote runner stages on a mount both sides share (test_beam_cluster.py: on S3 only)
    result, cfg = prepare(tmp_path, images, "beam", portable(beam_cluster),
                          beam={"staging": str(tmp_path / "shared")})
    assert result.returncode == 0, result.stderr
    assert prepared_bytes(cfg) == local_output
    pool_log = (tmp_path / "pool.log").read_text(errors="replace")
    assert "Starting worker with command" in pool_log  # the external pool ran the work


def test_a_worker_killed_mid_run_fails_in_one_line_and_a_rerun_gives_the_same_output(
        images, local_output, tmp_path):
    result, cfg = prepare(tmp_path, images, "beam", IN_PROCESS,
                          env={"TFMLOPS_FAULT": "beam.decode@3"})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Apache Beam failed" in errors[0], result.stderr
    assert not Path(cfg.paths.prepared).exists()  # nothing swapped in
    assert not list(tmp_path.glob("data/.prepared*"))  # nor a staging folder left
    result, cfg = prepare(tmp_path, images, "beam", IN_PROCESS)
    assert result.returncode == 0, result.stderr
    assert prepared_bytes(cfg) == local_output


# A secret planted where it must never be published (issue 47, M3): S3 keys come from the
# environment, and an option carrying one is refused before anything runs.
PLANTED = "pl4nted-S3-secret-47"


@pytest.mark.parametrize("options, named", [
    (["--runner=NoSuchRunner"], "NoSuchRunner"),
    (["--runner=DirectRunner", "--direct_num_wrokers=2"], "direct_num_wrokers"),
    (["--runner=DirectRunner", "--s3_secret_access_key", PLANTED], "--s3_secret_access_key"),
])
def test_a_bad_beam_option_exits_2_in_one_line(images, tmp_path, options, named):
    result, cfg = prepare(tmp_path, images, "beam", options)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and named in errors[0] and "data.beam.options" in errors[0], \
        result.stderr
    assert PLANTED not in result.stdout + result.stderr
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert not Path(params["paths"]["prepared"]).exists()


@pytest.fixture
def s3_photos(tmp_path):
    """A local S3-compatible server (moto's, on 127.0.0.1) holding a photo folder with a
    corrupt file and a duplicate; yields (the folder's URL, Beam's S3 options, the same
    folder on disk, the environment with the keys: moto takes any, so the secret is the
    planted one)."""
    import boto3
    from moto.server import ThreadedMotoServer

    root = tmp_path / "s3photos"
    files = photo_folder(root, per_class=6, classes=3, seed=3)
    (root / "c1" / "cut.jpg").write_bytes(files[7].read_bytes()[:150])
    (root / "c0" / "nested").mkdir()
    shutil.copy(files[2], root / "c0" / "nested" / "again.jpg")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    keys = {"aws_access_key_id": "test", "aws_secret_access_key": PLANTED}
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          **keys)
        s3.create_bucket(Bucket="tfmlops-photos")
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            s3.upload_file(str(path), "tfmlops-photos", f"team/{path.relative_to(root)}")
        # Beam's S3 client is a boto3 session given no keys: the usual AWS environment
        env = {"AWS_ACCESS_KEY_ID": keys["aws_access_key_id"],
               "AWS_SECRET_ACCESS_KEY": keys["aws_secret_access_key"]}
        yield ("s3://tfmlops-photos/team", [
            f"--s3_endpoint_url=http://127.0.0.1:{port}", "--s3_region_name=us-east-1"], root, env)
    finally:
        server.stop()


def test_an_s3_folder_gives_the_bytes_of_the_same_folder_on_disk(tmp_path, s3_photos):
    """data.image_dir as an s3:// URL, read through Beam's filesystems: the same
    data/prepared as the local engine on the folder's copy on disk, but for the manifest's
    image_dir, which records the URL. The keys come from the environment, and the
    secret is in no output, report, log or message."""
    url, s3_options, on_disk, keys = s3_photos
    result, cfg = prepare(tmp_path / "local", on_disk, "local")
    assert result.returncode == 0, result.stderr
    local = prepared_bytes(cfg)
    result, cfg = prepare(tmp_path / "s3", url, "beam", IN_PROCESS + s3_options, env=keys)
    assert result.returncode == 0, result.stderr
    written = [p for p in (tmp_path / "s3").rglob("*") if p.is_file()]
    assert any(p.name == "beam_workers.log" for p in written)
    for where, data in [("output", (result.stdout + result.stderr).encode()),
                        *((str(p), p.read_bytes()) for p in written)]:
        assert PLANTED.encode() not in data, f"{where} holds the S3 secret"
    assert "apitools not found" not in result.stderr  # Beam's import warning is kept quiet
    remote = prepared_bytes(cfg)
    manifests = [json.loads(side.pop("manifest.json")) for side in (local, remote)]
    assert manifests[1].pop("image_dir") == url
    assert manifests[0].pop("image_dir") == str(on_disk)
    assert manifests[0] == manifests[1] and local == remote
    assert "quarantine/c1/cut.jpg" in remote
    result, _ = prepare(tmp_path / "s3local", url, "local")
    assert result.returncode == 2 and "only data.engine: beam reads URLs" in result.stderr
