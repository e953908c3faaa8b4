"""`prepare` as users run it: the default params (tracking and profiling on), issue 26.

On the generated photo set at 1x and 4x (benchmarks/photo_set.py; default 1,000 and
4,000 images, image_size 96, 3 channels), the repo's params.yaml otherwise as it is:
tracking on, to a SQLite store in the scratch folder, and profiling as params.yaml
sets it. Each `tfmlops prepare` is a whole process, start-up included:

- cold: no output, no cache, no hash memo (the MLflow store already exists, as it does
  after the first stage of a project);
- +1%: 1% new photos copied into the set, then prepare again on the cold run's state;
- the ratio +1% / cold (target <= 25%) and the peak RSS of the process tree (the
  process and all its children, summed, every 50 ms; target <= 1 GB, 4x within +10%).

Python caches bytecode as it does for users (PYTHONDONTWRITEBYTECODE, which some
machines set, is dropped for the measured processes; the warm-up round writes it).
A run's seconds are until `tfmlops prepare` exits, what `dvc repro` waits for before
the next stage. With `tracking.wait: false` (the default) its tracking sidecar may
deliver the run after that: "delivered" is until the sidecar exited too (the run in
the store), and the CPU seconds and peak RSS count the sidecar to its end. Each run
starts once the previous one's run is delivered.

`--at-once`: each code also runs (label NAME+at-once) with its +1% run started as soon
as the cold process exits, as a user or a script rerunning at once does (issue 50's
way), instead of once its run is delivered. Until b6ffcab..dc2239a it then waited, at
its start, for the cold run's tracking sidecar to deliver (the delivery lock): the
difference between this benchmark's 13% and issue 50's 31% at 4x (BENCHMARKS.md,
Prepare). "overlap" is how long the cold run's sidecar was still delivering after the
+1% run started: with that wait, the +1% run's seconds grow with it. `--only-at-once`:
issue 50's way only.

`--code NAME=SRC` (repeatable) runs each round once per checkout's `src` folder (e.g.
a `git worktree` of the commit before a change), alternated, the order reversed every
round: the figures are medians over `--repeats` rounds.

    .venv/bin/python benchmarks/prepare_defaults.py [--set-1x /tmp/photos1k]
        [--set-4x /tmp/photos4k] [--repeats 3] [--code before=/tmp/base/src --code after=src]
        [--at-once | --only-at-once]

Writes reports/benchmarks/prepare_defaults.json (and prints a summary).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, save  # noqa: E402
from photo_set import make_photo_set  # noqa: E402
from prepare_photos import CLASSES, SIZE, photo_files, subset, timed_prepare  # noqa: E402

SCALES = (("1x", 1000), ("4x", 4000))
AT_ONCE = "+at-once"  # a code's label suffix: its +1% run starts as the cold one exits


def default_params(workdir: Path, image_dir: Path) -> Path:
    """The repo's params with every path under `workdir` and the photo set as data; tracking
    and profiling stay as params.yaml has them (on), the store a SQLite file in `workdir`."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["paths"] = {k: str(workdir / v) for k, v in params["paths"].items()}
    params["data"].update(image_dir=str(image_dir), image_size=SIZE, channels=3)
    params["tracking"]["uri"] = f"sqlite:///{workdir / 'mlflow.db'}"  # absolute: four slashes
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def one_round(params: Path, images: Path, extra: list[Path], env: dict,
              at_once: bool = False) -> dict:
    """A cold prepare, then the same after copying `extra` (1% new photos) in; `at_once`:
    as soon as the cold process exits (its "delivered" and CPU are then until exit)."""
    data = params.parent / "data"
    for folder in ("prepared", "prepare_cache"):
        shutil.rmtree(data / folder, ignore_errors=True)
    for p in extra:  # the set as the cold run must see it
        (images / p.parent.name / p.name).unlink(missing_ok=True)
    cold = timed_prepare(params, env, wait_for_delivery=not at_once)
    for p in extra:
        os.link(p, images / p.parent.name / p.name)
    overlap = _still_delivering(cold["sidecar_pid"] if at_once else None)
    more = timed_prepare(params, env)
    assert more["metrics"]["images_decoded"] == len(extra), more["metrics"]
    return {"cold_s": cold["wall_s"], "plus1_s": more["wall_s"], "overlap_s": overlap(),
            # until the run is in the store (a detached sidecar delivers after prepare exits)
            "cold_delivered_s": cold["delivered_s"], "plus1_delivered_s": more["delivered_s"],
            "ratio": round(more["wall_s"] / cold["wall_s"], 3),
            # CPU seconds of the tree: what other jobs on a shared machine move least
            "cold_cpu_s": cold["cpu_s"], "plus1_cpu_s": more["cpu_s"],
            "peak_rss_mb": max(cold["peak_rss_mb"], more["peak_rss_mb"]),
            "cold_metrics": cold["metrics"]}


def _still_delivering(pid: int | None):
    """Start timing how long the process `pid` (the cold run's tracking sidecar) lives on
    from now; returns the function that waits for its exit and gives those seconds
    (0 without a pid)."""
    import psutil

    started, ended = time.perf_counter(), {}

    def watch() -> None:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            while process.status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.02)
        ended["s"] = time.perf_counter() - started

    if pid is None:
        return lambda: 0.0
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return lambda: (watcher.join(), round(ended["s"], 2))[1]


def median_of(rounds: list[dict]) -> dict:
    keys = ("cold_s", "plus1_s", "ratio", "peak_rss_mb", "cold_cpu_s", "plus1_cpu_s",
            "cold_delivered_s", "plus1_delivered_s", "overlap_s")
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in keys}


def measure(sets: dict[str, Path], codes: dict[str, str], repeats: int) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="tfmlops-prepare-defaults-"))
    setups = {}
    for scale, source in sets.items():
        n = len(photo_files(source))
        extra_dir = scratch / f"extra_{scale}"
        make_photo_set(extra_dir, max(1, n // 100), CLASSES, seed=0, start=10 * n)  # new photos
        for code in codes:
            work = scratch / f"{code}_{scale}"
            images = subset(source, work / "photos", n)
            setups[(code, scale)] = (default_params(work, images), images, photo_files(extra_dir))
    rounds: dict = {key: [] for key in setups}
    # Python as users have it: bytecode cached after the first run (the warm-up round
    # writes it). A machine that sets PYTHONDONTWRITEBYTECODE compiles the package's
    # modules on every run, which no user's second run does.
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    envs = {code: {**base, "PYTHONPATH": src} for code, src in codes.items()}
    order = list(codes)
    for key, (params, images, extra) in setups.items():  # warm-up: the store, the page cache
        one_round(params, images, extra, envs[key[0]])
    for i in range(repeats):
        for code in order if i % 2 == 0 else order[::-1]:
            for scale in sets:
                params, images, extra = setups[(code, scale)]
                r = one_round(params, images, extra, envs[code], code.endswith(AT_ONCE))
                rounds[(code, scale)].append(r)
                print(f"round {i + 1} {code} {scale}: cold {r['cold_s']} s, +1% {r['plus1_s']} s "
                      f"({r['ratio']:.0%}), cold run still delivering for {r['overlap_s']} s "
                      f"of it, run delivered at {r['cold_delivered_s']} / "
                      f"{r['plus1_delivered_s']} s, CPU {r['cold_cpu_s']} / {r['plus1_cpu_s']} s, peak "
                      f"{r['peak_rss_mb']} MB", flush=True)
    result = {}
    for code in codes:
        per = {scale: {**median_of(rounds[(code, scale)]),
                       "rounds": [{k: v for k, v in r.items() if k != "cold_metrics"}
                                  for r in rounds[(code, scale)]]} for scale in sets}
        peaks = [per[s]["peak_rss_mb"] for s in sets]
        per["rss_growth_4x"] = round(peaks[-1] / peaks[0], 3)
        per["rss_met"] = max(peaks) <= 1024 and peaks[-1] / peaks[0] <= 1.10
        per["ratio_met"] = all(per[s]["ratio"] <= 0.25 for s in sets)
        result[code] = per
    return {"scratch": str(scratch), "repeats": repeats, "codes": codes, "results": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set-1x", type=Path, default=Path("/tmp/photos1k"))
    parser.add_argument("--set-4x", type=Path, default=Path("/tmp/photos4k"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scales", default="1x,4x", help="which sets to run (1x, 4x or both)")
    parser.add_argument("--code", action="append", default=[],
                        help="NAME=SRC: a checkout's src folder (repeatable; default: this one)")
    parser.add_argument("--at-once", action="store_true",
                        help="each code also with its +1%% run started as soon as the cold "
                        "process exits (label NAME+at-once), alternated")
    parser.add_argument("--only-at-once", action="store_true",
                        help="only that way (issue 50's measurement)")
    args = parser.parse_args()
    sets = {scale: folder for scale, folder in (("1x", args.set_1x), ("4x", args.set_4x))
            if scale in args.scales.split(",")}
    for scale, images in SCALES:
        if scale in sets and not photo_files(sets[scale]):
            make_photo_set(sets[scale], images, CLASSES, seed=0)
    codes = dict(c.split("=", 1) for c in args.code) or {"this": str(ROOT / "src")}
    if args.only_at_once:
        codes = {f"{code}{AT_ONCE}": src for code, src in codes.items()}
    elif args.at_once:  # each code both ways, alternated in every round
        codes |= {f"{code}{AT_ONCE}": src for code, src in codes.items()}
    result = {"command": " ".join(["benchmarks/prepare_defaults.py", *sys.argv[1:]]),
              **measure(sets, codes, args.repeats)}
    path = save("prepare_defaults", result)
    print("\ncode     scale  peak tree RSS MB  cold s  +1% s  +1%/cold  delivered cold / +1% s  "
          "CPU s cold / +1%  overlap s  (medians)")
    for code, per in result["results"].items():
        for scale in sets:
            r = per[scale]
            print(f"{code:8} {scale:5}  {r['peak_rss_mb']:>16}  {r['cold_s']:>6}  "
                  f"{r['plus1_s']:>5}  {r['ratio']:>8.0%}  {r['cold_delivered_s']:>13} / "
                  f"{r['plus1_delivered_s']:<6}  {r['cold_cpu_s']} / {r['plus1_cpu_s']}  "
                  f"{r['overlap_s']}")
        print(f"{code:8} 4x/1x RSS {per['rss_growth_4x']}x  (<= 1 GB, <= 1.1x: "
              f"{'met' if per['rss_met'] else 'MISSED'}); +1% <= 25%: "
              f"{'met' if per['ratio_met'] else 'MISSED'}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
