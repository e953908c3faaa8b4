"""The Beam engine's driver memory (issue 52): peak RSS of the `tfmlops prepare` process
itself, and of the worker pool's process tree, on Beam's portable job service with an
external worker pool (the runner's shuffles and the workers are outside the driver), at
two sizes of a folder of tiny 8x8 PNGs, before (a revision, default b0a5723) and after
(this checkout), in one run.

The images: sklearn's 1,797 digits in 10 class folders, each file's first three pixels
set from its number so that every file's bytes differ. Each revision gets its own job
service and worker pool (the pool imports the revision's code: PYTHONPATH), started
in the run's folder. psutil samples every 50 ms: the prepare process alone (the
driver), the pool and its children (the SDK workers), the job service. Target: the
driver's peak grows by at most 10 MB from the small to the large folder.

    .venv/bin/python benchmarks/beam_driver_memory.py [--sizes 4000 80000]
        [--before b0a5723]

Writes reports/benchmarks/beam_driver_memory.json (and prints a table).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, machine, save, scratch_config  # noqa: E402
from prepare_beam import start_cluster  # noqa: E402

BIN = Path(sys.executable).parent


def tiny_pngs(folder: Path, n: int) -> Path:
    """`n` 8x8 grey PNGs in 10 class folders (the digit's label), each file's bytes its own."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    if folder.exists() and sum(1 for _ in folder.rglob("*.png")) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    digits = load_digits()
    pixels = (digits.images * (255 / 16)).astype(np.uint8)
    for label in range(10):
        (folder / f"digit{label}").mkdir(parents=True)
    for i in range(n):
        k = i % len(pixels)
        img = pixels[k].copy()
        img[0, :3] = (i & 255, (i >> 8) & 255, (i >> 16) & 255)  # every file differs
        Image.fromarray(img, "L").save(folder / f"digit{digits.target[k]}" / f"{i:07d}.png")
    return folder


def tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measured_prepare(params: Path, env: dict, procs: list[subprocess.Popen]) -> dict:
    """`tfmlops prepare` with peak RSS sampled: the driver alone, the pool's tree, the
    job service's tree."""
    import psutil

    shutil.rmtree(params.parent / "data" / "prepared", ignore_errors=True)
    log = params.parent / "prepare.log"
    start = time.perf_counter()
    with log.open("wb") as out:
        proc = psutil.Popen([str(BIN / "tfmlops"), "--params", str(params), "prepare"],
                            cwd=params.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
        peak = {"driver": 0, "pool": 0, "job": 0}
        while proc.poll() is None:
            try:
                peak["driver"] = max(peak["driver"], proc.memory_info().rss)
            except psutil.Error:
                pass
            peak["job"] = max(peak["job"], tree_rss(procs[0].pid))
            peak["pool"] = max(peak["pool"], tree_rss(procs[1].pid))
            time.sleep(0.05)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed ({proc.returncode}); see {log}:\n"
                         + log.read_text()[-2000:])
    mb = {f"{k}_peak_mb": round(v / 2**20, 1) for k, v in peak.items()}
    return {**mb, "wall_s": round(wall, 1), **digests(params.parent / "data" / "prepared")}


def digests(folder: Path) -> dict:
    """sha256 of data/prepared, and of it without stats.json (whose float sums became
    exact sums with issue 52: their last bits may differ from an older revision's)."""
    full, data = hashlib.sha256(), hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            chunk = str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes()
            full.update(chunk)
            if p.name != "stats.json":
                data.update(chunk)
    return {"digest": full.hexdigest()[:16], "digest_without_stats": data.hexdigest()[:16]}


def revision(rev: str, parent: Path) -> Path:
    """A clone of this repository at `rev`: its src is what that revision runs."""
    dest = parent / f"rev-{rev[:12]}"
    if not dest.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
        subprocess.run(["git", "-C", str(dest), "checkout", "-q", rev], check=True)
    return dest / "src"


def configure(work: Path, repo: Path, images: Path, options: list[str]) -> Path:
    """`repo`'s own params.yaml (an older revision knows fewer keys), set for this run."""
    work.mkdir(parents=True, exist_ok=True)
    _, work = scratch_config(work, repo, load=False, data={
        "image_dir": str(images), "image_size": 8, "channels": 1, "engine": "beam"})
    params = yaml.safe_load((work / "params.yaml").read_text())
    # a PortableRunner's workers write under data.beam.staging (a revision that has it);
    # here a folder on this machine, which the pool on this machine shares
    staged = {"staging": str(work / "staging")} if "staging" in params["data"]["beam"] else {}
    params["data"]["beam"] = {"options": options, **staged}
    params["data"]["contract"]["reference"] = str(work / "no_reference.json")
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return work / "params.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4000, 80000])
    parser.add_argument("--before", default="b0a5723")
    parser.add_argument("--codes", nargs="+", default=["before", "after"],
                        choices=["before", "after"], help="which to run (both: alternated)")
    parser.add_argument("--scratch", type=Path,
                        default=Path(tempfile.gettempdir()) / "tfmlops-beam-driver")
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    code = {name: revision(args.before, args.scratch) if name == "before" else ROOT / "src"
            for name in args.codes}
    sets = {n: tiny_pngs(args.scratch / f"pngs{n}", n) for n in args.sizes}
    runs: dict[str, dict[int, dict]] = {name: {} for name in code}
    for i, n in enumerate(args.sizes):  # before and after alternate, size by size
        for name in list(code) if i % 2 == 0 else list(code)[::-1]:
            # the pool starts its workers as `python`: this environment's, first on PATH
            env = {**os.environ, "PYTHONPATH": str(code[name]), "PYTHONUNBUFFERED": "1",
                   "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
            work = args.scratch / f"{name}-{n}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            procs, options = start_cluster(None, env, work)
            try:
                params = configure(work, code[name].parent, sets[n], options)
                runs[name][n] = measured_prepare(params, env, procs)
            finally:
                for proc in procs:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            print(f"{name} {n}: {runs[name][n]}", flush=True)
    report(runs, args)


def report(runs: dict, args) -> None:
    small, large = min(args.sizes), max(args.sizes)
    result = {"sizes": args.sizes, "before": args.before, "machine": machine(), "runs": runs,
              "command": " ".join(["benchmarks/beam_driver_memory.py", *sys.argv[1:]])}
    print(f"\n{'code':8} {'files':>7} {'driver MB':>10} {'pool MB':>8} {'job MB':>7} "
          f"{'wall s':>7} {'prepared':>17}")
    for name, by_size in runs.items():
        for n, r in sorted(by_size.items()):
            print(f"{name:8} {n:>7} {r['driver_peak_mb']:>10} {r['pool_peak_mb']:>8} "
                  f"{r['job_peak_mb']:>7} {r['wall_s']:>7} {r['digest_without_stats']:>17}")
        growth = by_size[large]["driver_peak_mb"] - by_size[small]["driver_peak_mb"]
        result[f"{name}_driver_growth_mb"] = round(growth, 1)
        print(f"{name}: the driver's peak grows {growth:+.1f} MB from {small} to {large} files")
    for n in args.sizes if len(runs) == 2 else []:
        same = runs["before"][n]["digest_without_stats"] == runs["after"][n]["digest_without_stats"]
        result[f"same_prepared_{n}"] = same
        print(f"{n} files: data/prepared but stats.json identical before and after: {same}; "
              f"stats.json too: {runs['before'][n]['digest'] == runs['after'][n]['digest']}")
    print(f"-> {save('beam_driver_memory', result)}")


if __name__ == "__main__":
    main()
