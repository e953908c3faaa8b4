"""prepare on a cluster's topology whose workers share nothing with the driver but
`data.beam.staging` (issue 52): Beam's portable job service and an external SDK worker
pool, each started in its own mount namespace (`unshare -m`) where the driver's folders
(the tests' temp folders, the checkout, the venv) are read-only, their cwd elsewhere, and
the staging URL on moto's S3 server on 127.0.0.1. The images are on a read-only mount the
workers share, as a cluster's input is. data/prepared is the local engine's, byte for
byte; a worker killed mid-run and the driver killed mid-run leave nothing swapped in,
and the rerun gives the same bytes and removes the killed run's prefix, never anything
else under the staging URL. (This proves isolation, not parallelism: Beam's Python job
service runs one worker at a time, and Flink or Spark job servers are not installable here.)
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import test_beam
from test_beam import _wait_for_port, portable, prepare, prepared_bytes, with_group

from conftest import child_env, free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # a job service, pools, moto

BUCKET = "tfmlops-staging"
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}  # moto takes any
REPO = Path(__file__).resolve().parents[2]
# the same photos as test_beam's (corrupt files, a duplicate, one in two classes, a symlink
# out of the folder), and the local engine's bytes for them
images, local_output = test_beam.images, test_beam.local_output


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 with an empty staging bucket: (boto3 client, Beam's
    S3 options)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                              region_name="us-east-1", aws_access_key_id="test",
                              aws_secret_access_key="test")
        client.create_bucket(Bucket=BUCKET)
        yield client, [f"--s3_endpoint_url=http://127.0.0.1:{port}", "--s3_region_name=us-east-1"]
    finally:
        server.stop()


class Isolated:
    """Beam services started where the driver's folders are read-only."""

    def __init__(self, readonly: list[Path]):
        self.readonly = [str(p) for p in readonly]
        self.home = Path(tempfile.mkdtemp(prefix="tfmlops-cluster-"))  # cwd, TMPDIR, logs
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, module: str, flag: str, env: dict | None = None) -> int:
        """`python -m module flag PORT` in a mount namespace of its own; its port. The
        script first checks that it cannot write to the driver's folders (exit 3)."""
        port = free_port()
        ro = " ".join(shlex.quote(p) for p in self.readonly)
        script = (f"for d in {ro}; do mount --bind -o ro \"$d\" \"$d\" || exit 4; done; "
                  f"for d in {ro}; do if touch \"$d/.tfmlops-probe\" 2>/dev/null; then "
                  "echo \"$d is writable\"; exit 3; fi; done; "
                  f"cd {shlex.quote(str(self.home))} && exec {shlex.quote(sys.executable)} "
                  f"-m {module} {flag} {port}")
        env = {**child_env(), **KEYS, "PYTHONUNBUFFERED": "1", "TMPDIR": str(self.home),
               **(env or {})}
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                env=env, cwd=self.home, stdout=open(self.home / f"{name}.log", "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        _wait_for_port(port, [proc])
        return port

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            with_group(proc, 9)
            proc.wait(30)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A job service and a healthy worker pool, isolated; (Isolated, job port, pool port)."""
    services = Isolated([tmp_path_factory.getbasetemp(), REPO, Path(sys.prefix)])
    try:
        job = services.start("job", "apache_beam.runners.portability.local_job_service_main",
                             "--port")
        pool = services.start("pool", "apache_beam.runners.worker.worker_pool_main",
                              "--service_port")
        yield services, job, pool
    finally:
        services.stop()


def staged(client, prefix: str) -> list[str]:
    found = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in found)


def run_on(cluster, s3, work: Path, images: Path, runs: str, pool: int | None = None,
           env=None, **beam):
    services, job, healthy = cluster
    options = portable({"job": job, "pool": pool or healthy}) + s3[1]
    return prepare(work, images, "beam", options, env={**KEYS, **(env or {})},
                   beam={"staging": f"s3://{BUCKET}/{runs}", **beam})


def one_error(result) -> str:
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_workers_sharing_only_the_staging_url_write_the_local_bytes(
        images, local_output, tmp_path, cluster, s3):
    """Plant: the workers writing into the driver's staging folder (the code before
    issue 52) fail here: the driver's folders are read-only where they run."""
    client = s3[0]
    theirs = ["runs1/theirs.txt", "runs1/tfmlops-prepare-20200101T000000000000Z-0123456789ab/x"]
    for key in theirs:  # under the staging URL, not made by prepare: kept
        client.put_object(Bucket=BUCKET, Key=key, Body=b"theirs")
    result, cfg = run_on(cluster, s3, tmp_path, images, "runs1")
    assert result.returncode == 0, result.stderr + cluster[0].log("pool")[-3000:]
    assert prepared_bytes(cfg) == local_output
    assert "Starting worker with command" in cluster[0].log("pool")  # the pool did the work
    assert staged(client, "runs1/") == sorted(theirs)  # its own prefix removed, nothing else


@pytest.mark.parametrize("signal", ["SIGKILL", "SIGSTOP"])
def test_a_worker_killed_or_hung_mid_run_fails_in_one_line_and_a_rerun_gives_the_bytes(
        images, local_output, tmp_path, cluster, s3, signal):
    """When an external SDK worker dies, Beam's local job service either fails the job
    ("Channel closed prematurely") or waits for the worker forever (both seen here, by
    where the worker was); the driver then cancels the job at data.beam.deadline_s.
    A worker stopped (SIGSTOP: hung) is always waited for, so always cancelled.
    Either way: one error line and its prefix removed; the rerun gives the bytes."""
    services = cluster[0]
    doomed = services.start("doomed_pool", "apache_beam.runners.worker.worker_pool_main",
                            "--service_port", env={"TFMLOPS_FAULT": "beam.decode@3",
                                                   "TFMLOPS_FAULT_SIGNAL": signal})
    result, cfg = run_on(cluster, s3, tmp_path, images, f"runs-{signal}", pool=doomed,
                         deadline_s=10)
    assert result.returncode == 2, result.stderr
    error = one_error(result)
    cancelled = "data.beam.deadline_s" in error and "cancelled" in error
    assert cancelled or signal == "SIGKILL" and "Apache Beam failed" in error, error
    assert not Path(cfg.paths.prepared).exists()  # nothing swapped in
    assert staged(s3[0], f"runs-{signal}/") == []  # its prefix removed by the driver
    if signal == "SIGSTOP":
        return  # the rerun after a kill is the same as after a hang (CI's 3 minutes)
    result, cfg = run_on(cluster, s3, tmp_path, images, f"runs-{signal}")
    assert result.returncode == 0, result.stderr
    assert prepared_bytes(cfg) == local_output


def test_the_driver_killed_mid_run_leaves_a_prefix_the_rerun_removes(
        images, local_output, tmp_path, cluster, s3):
    client = s3[0]
    earlier = set(_jobs(cluster[1]))
    result, cfg = run_on(cluster, s3, tmp_path, images, "runs3",
                         env={"TFMLOPS_FAULT": "beam.submitted"})
    assert result.returncode == -9, result.stderr  # killed right after submitting its job
    assert not Path(cfg.paths.prepared).exists()
    _wait_for_jobs(cluster[1], but=earlier)  # its job went on without it: let it end
    killed = {key.split("/")[1] for key in staged(client, "runs3/")}
    assert len(killed) == 1 and staged(client, f"runs3/{next(iter(killed))}/tfmlops-prepare.owner")
    client.put_object(Bucket=BUCKET, Key="runs3/theirs.txt", Body=b"theirs")
    result, cfg = run_on(cluster, s3, tmp_path, images, "runs3")
    assert result.returncode == 0, result.stderr
    assert prepared_bytes(cfg) == local_output
    assert "removed 1 stale Beam staging prefix" in result.stderr
    assert staged(client, "runs3/") == ["runs3/theirs.txt"]


def test_the_driver_terminated_mid_run_cancels_its_job_and_removes_its_prefix(
        images, tmp_path, cluster, s3):
    """SIGTERM (or Ctrl-C) while the job runs: the driver cancels it on the runner before
    removing its prefix, so no worker writes under a prefix that is gone."""
    earlier = set(_jobs(cluster[1]))
    result, cfg = run_on(cluster, s3, tmp_path, images, "runs4",
                         env={"TFMLOPS_FAULT": "beam.submitted", "TFMLOPS_FAULT_SIGNAL": "SIGTERM"})
    assert result.returncode == 143, result.stderr
    assert len([line for line in result.stderr.splitlines() if "SIGTERM" in line]) == 1, \
        result.stderr
    assert not Path(cfg.paths.prepared).exists()
    assert staged(s3[0], "runs4/") == []
    from apache_beam.portability.api import beam_job_api_pb2

    ours = {job: state for job, state in _jobs(cluster[1]).items() if job not in earlier}
    assert list(ours.values()) == [beam_job_api_pb2.JobState.CANCELLED], ours


def test_a_staging_url_that_cannot_be_written_fails_in_one_line(images, tmp_path, s3):
    result, _ = prepare(tmp_path, images, "beam", test_beam.IN_PROCESS + s3[1], env=KEYS,
                        beam={"staging": "s3://no-such-bucket/runs"})
    assert result.returncode == 2, result.stderr
    assert "data.beam.staging s3://no-such-bucket/runs cannot be written" in one_error(result)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no traceback above it
    assert not (tmp_path / "data" / "prepared").exists()


def test_a_folder_with_nothing_refused_stages_on_s3(tmp_path, s3):
    """No file refused: no refused files' part is staged (Beam cannot write an empty
    object to S3) and quarantine.json is an empty list. Plant: staging the empty part
    fails the run."""
    from images import photo_folder

    photo_folder(tmp_path / "clean", per_class=10, classes=2, seed=3)
    result, cfg = prepare(tmp_path / "work", tmp_path / "clean", "beam",
                          test_beam.IN_PROCESS + s3[1], env=KEYS,
                          beam={"staging": f"s3://{BUCKET}/clean"})
    assert result.returncode == 0, result.stderr
    assert (Path(cfg.paths.prepared) / "quarantine.json").read_text() == "[]\n"
    assert staged(s3[0], "clean/") == []


def _jobs(job_port: int) -> dict[str, int]:
    """{job id: state} of the jobs on the job service."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(f"localhost:{job_port}") as channel:
        infos = beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(
            beam_job_api_pb2.GetJobsRequest()).job_info
    return {info.job_id: info.state for info in infos}


def _wait_for_jobs(job_port: int, but: set[str], timeout: float = 120) -> None:
    """Until every job on the job service, `but` those, is in a terminal state."""
    from apache_beam.portability.api import beam_job_api_pb2

    ended = {beam_job_api_pb2.JobState.DONE, beam_job_api_pb2.JobState.FAILED,
             beam_job_api_pb2.JobState.CANCELLED}
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if all(state in ended for job, state in _jobs(job_port).items() if job not in but):
            return
        time.sleep(0.5)
    raise TimeoutError("the killed driver's job did not end")


def test_a_prefix_on_s3_is_removed_whole_whatever_its_names(s3, monkeypatch):
    """Beam's filesystems read names as patterns in places: `[1]` or `*` in a staged
    name must neither survive the removal nor take anything else with it."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfmlops.stages.prepare import beam_staging as staging

    client, options = s3
    for key, value in KEYS.items():
        monkeypatch.setenv(key, value)
    FileSystems.set_options(PipelineOptions(options))
    client.put_object(Bucket=BUCKET, Key="odd/theirs[1].jpg", Body=b"theirs")
    run = staging.RunPrefix(f"s3://{BUCKET}/odd").start()
    for name in ("quarantine/c[1]/a[1].jpg", "quarantine/c1/*.jpg", "train-00000.part"):
        with staging.create(staging.join(run.base, name)) as fh:
            fh.write(b"x")
    assert len(run.files("quarantine/**")) == 2
    run.remove()
    assert staged(client, "odd/") == ["odd/theirs[1].jpg"]
