"""`prepare` on its two engines, side by side (issue 29): the local process pool vs
Apache Beam's in-process runner with 2 worker processes vs a portable job service with
an external SDK worker pool (each its own process on 127.0.0.1), on the generated
photo set (benchmarks/photo_set.py; default 4,000 photos, image_size 96, RGB), every
run cold (no output, no cache: the Beam engine is always cold), tracking and
profiling off, alternated round by round, medians.

Per engine: wall seconds of the whole `tfmlops prepare` process, images/s, CPU
seconds of the process tree per image, peak tree RSS, and where the time went
(listing; the decode pass or Beam's pipeline, its workers' start included; the
rest: imports, the write pass or the driver's fold, manifest and statistics), and
each Beam path's ratio to the local one. The outputs are checked byte-identical.

    .venv/bin/python benchmarks/prepare_beam.py [--set /tmp/photos4k] [--images 4000]
        [--repeats 3] [--workers 2]

Writes reports/benchmarks/prepare_beam.json (and prints a table).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, save, scratch_config  # noqa: E402
from photo_set import make_photo_set  # noqa: E402
from prepare_photos import CLASSES, SIZE, photo_files, subset, timed_prepare  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(workers: int | None, env: dict | None = None,
                  cwd: Path | None = None) -> tuple[list[subprocess.Popen], list[str]]:
    """A job service and an external worker pool (running `env`'s code, in `cwd`, their
    output in `cwd`/job.log and pool.log); the options that submit to them (`workers`
    per SDK worker; None: Beam's default)."""
    job, pool = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", module, flag, str(port)], env=env, cwd=cwd,
                              stdout=open(cwd / f"{name}.log", "wb") if cwd else subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True)
             for name, module, flag, port in (
                 ("job", "apache_beam.runners.portability.local_job_service_main", "--port", job),
                 ("pool", "apache_beam.runners.worker.worker_pool_main", "--service_port", pool))]
    for port in (job, pool):
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
    return procs, ["--runner=PortableRunner", f"--job_endpoint=localhost:{job}",
                   "--environment_type=EXTERNAL", f"--environment_config=localhost:{pool}",
                   *([f"--sdk_worker_parallelism={workers}"] if workers else [])]


def configure(work: Path, images: Path, engine: str, options: list[str] | None) -> Path:
    data = {"image_dir": str(images), "image_size": SIZE, "channels": 3, "engine": engine}
    work.mkdir(parents=True, exist_ok=True)
    _, work = scratch_config(work, data=data)
    params = yaml.safe_load((work / "params.yaml").read_text())
    if options:  # a job service's workers write under data.beam.staging: a folder here
        remote = "--runner=DirectRunner" not in options
        params["data"]["beam"] = {"options": options,
                                  **({"staging": str(work / "staging")} if remote else {})}
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return work / "params.yaml"


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def cluster_cpu(procs: list[subprocess.Popen]) -> float:
    """CPU seconds so far of the job service's and the worker pool's process trees (the
    SDK workers the pool starts are its children): outside prepare's own tree."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def cold(params: Path, procs: list[subprocess.Popen] | None = None) -> dict:
    for folder in ("prepared", "prepare_cache"):
        shutil.rmtree(params.parent / "data" / folder, ignore_errors=True)
    before = cluster_cpu(procs or [])
    run = timed_prepare(params)
    run["cpu_s"] = round(run["cpu_s"] + cluster_cpu(procs or []) - before, 2)
    run["digest"] = digest(params.parent / "data" / "prepared")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=Path("/tmp/photos4k"))
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if len(photo_files(args.set)) < args.images:
        make_photo_set(args.set, args.images, CLASSES, seed=0)
    scratch = Path(tempfile.mkdtemp(prefix="tfmlops-prepare-beam-"))
    images = subset(args.set, scratch / "photos", args.images)
    n = len(photo_files(images))
    procs, portable = start_cluster(args.workers)
    try:
        runs = measure(scratch, images, portable, procs, args)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
    report(runs, n, args)


def measure(scratch: Path, images: Path, portable: list[str], procs, args) -> dict[str, list[dict]]:
    in_process = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                  f"--direct_num_workers={args.workers}"]
    engines = {"local pool": configure(scratch / "local", images, "local", None),
               "Beam in-process": configure(scratch / "direct", images, "beam", in_process),
               "Beam job service": configure(scratch / "portable", images, "beam", portable)}
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for i in range(args.repeats):
        for name in list(engines) if i % 2 == 0 else list(engines)[::-1]:
            run = cold(engines[name], procs if "job" in name else None)
            runs[name].append(run)
            print(f"round {i + 1} {name}: {run['wall_s']} s, CPU {run['cpu_s']} s, peak "
                  f"{run['peak_rss_mb']} MB", flush=True)
    return runs


def report(runs: dict[str, list[dict]], n: int, args) -> None:
    digests = {name: {r["digest"] for r in rs} for name, rs in runs.items()}
    result = {"images": n, "image_size": SIZE, "workers": args.workers, "repeats": args.repeats,
              "machine": machine(), "identical_outputs": len(set().union(*digests.values())) == 1,
              "command": " ".join(["benchmarks/prepare_beam.py", *sys.argv[1:]]), "engines": {}}
    local_wall = statistics.median(r["wall_s"] for r in runs["local pool"])
    med = lambda values: round(statistics.median(values), 2)  # noqa: E731
    for name, rs in runs.items():
        wall = med(r["wall_s"] for r in rs)
        m = [r["metrics"] for r in rs]
        result["engines"][name] = {
            "wall_s": wall, "images_per_s": round(n / wall, 1),
            "ratio_to_local": round(local_wall / wall, 3),
            "cpu_ms_per_image": round(1000 * med(r["cpu_s"] for r in rs) / n, 2),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "list_s": med(x["list_seconds"] for x in m),
            "decode_or_pipeline_s": med(x["decode_seconds"] for x in m),
            "rest_s": round(wall - med(x["decode_seconds"] + x["list_seconds"] for x in m), 2),
            "walls": [r["wall_s"] for r in rs]}
    path = save(f"prepare_beam_{n}", result)
    print(f"\n{n} photos, {args.workers} workers, medians of {args.repeats}; outputs identical: "
          f"{result['identical_outputs']}")
    print(f"{'engine':18} {'wall s':>7} {'img/s':>7} {'x local':>8} {'CPU ms/img':>10} "
          f"{'peak MB':>8} {'list s':>7} {'decode/pipeline s':>18} {'rest s':>7}")
    for name, e in result["engines"].items():
        print(f"{name:18} {e['wall_s']:>7} {e['images_per_s']:>7} {e['ratio_to_local']:>8} "
              f"{e['cpu_ms_per_image']:>10} {e['peak_rss_mb']:>8} {e['list_s']:>7} "
              f"{e['decode_or_pipeline_s']:>18} {e['rest_s']:>7}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
