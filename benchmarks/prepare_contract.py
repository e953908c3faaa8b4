"""`prepare` with the data contract's profile on vs off (issue 28: at most 10% slower).

On the generated photo set (benchmarks/photo_set.py, default /tmp/photos1k: 1,000
images, 8 classes), image_size 96, RGB, the repo's params otherwise as they are:
tracking on (a SQLite store in the scratch folder; the profile's figure is drawn for
the run), leakage searched, drift checked against a reference accepted from a first
run. Each `tfmlops prepare` is a cold, whole process (no output, no cache, no hash
memo), as under `dvc repro`; on and off alternate, the order reversed every round.
The figures are medians; the ratio is on / off of wall time, and of the process
tree's CPU seconds (what other jobs on a shared machine move least).

With the profile off, the workers still measure each image's facts (they are part of
every cache entry, whatever the param): `--code base=SRC` adds a third side, a
checkout from before the contract (e.g. `git archive <commit> src | tar -x -C DIR`).

    .venv/bin/python benchmarks/prepare_contract.py [--set /tmp/photos1k] [--repeats 3]
        [--code base=/tmp/base/src]

Writes reports/benchmarks/prepare_contract.json (and prints a summary).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, save  # noqa: E402
from photo_set import make_photo_set  # noqa: E402
from prepare_defaults import default_params  # noqa: E402
from prepare_photos import CLASSES, photo_files, subset, timed_prepare  # noqa: E402


def side_params(work: Path, images: Path, profile: bool | None) -> Path:
    """The default params in `work`, with data.contract.profile set (None: a checkout
    that has no contract, params without the section)."""
    params = default_params(work, images)
    values = yaml.safe_load(params.read_text())
    if profile is None:
        values["data"].pop("contract", None)
    else:
        values["data"]["contract"].update(profile=profile, reference=str(work / "reference.json"))
    params.write_text(yaml.safe_dump(values, sort_keys=False))
    return params


def cold(params: Path, env: dict) -> dict:
    for folder in ("prepared", "prepare_cache"):
        shutil.rmtree(params.parent / "data" / folder, ignore_errors=True)
    return timed_prepare(params, env)


def measure(source: Path, repeats: int, base: str | None) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="tfmlops-prepare-contract-"))
    this = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    sides = {"on": (True, this), "off": (False, this)}
    if base:
        sides["base"] = (None, {**os.environ, "PYTHONPATH": base})
    setups = {}
    for name, (profile, env) in sides.items():
        work = scratch / name
        images = subset(source, work / "photos", len(photo_files(source)))
        setups[name] = side_params(work, images, profile)
        cold(setups[name], env)  # warm-up: the store, the page cache
    # Drift is checked too: against the profile of the warm-up run, accepted.
    shutil.copyfile(scratch / "on" / "reports" / "data_profile.json", scratch / "on" / "reference.json")
    runs: dict = {name: [] for name in sides}
    order = list(sides)
    for i in range(repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            r = cold(setups[name], sides[name][1])
            runs[name].append(r)
            print(f"round {i + 1} {name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")}
           for name, rs in runs.items()}
    result = {"scratch": str(scratch), "images": len(photo_files(source)), "repeats": repeats,
              "medians": med, "runs": {n: [{k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}
                                           for r in rs] for n, rs in runs.items()},
              "ratio_wall": round(med["on"]["wall_s"] / med["off"]["wall_s"], 3),
              "ratio_cpu": round(med["on"]["cpu_s"] / med["off"]["cpu_s"], 3)}
    if base:
        result["ratio_wall_vs_base"] = round(med["on"]["wall_s"] / med["base"]["wall_s"], 3)
        result["ratio_cpu_vs_base"] = round(med["on"]["cpu_s"] / med["base"]["cpu_s"], 3)
    result["met"] = result["ratio_wall"] <= 1.10
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=Path("/tmp/photos1k"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", action="append", default=[],
                        help="base=SRC: a checkout from before the contract, as a third side")
    args = parser.parse_args()
    if not photo_files(args.set):
        make_photo_set(args.set, 1000, CLASSES, seed=0)
    base = dict(c.split("=", 1) for c in args.code).get("base")
    result = {"command": " ".join(["benchmarks/prepare_contract.py", *sys.argv[1:]]),
              **measure(args.set, args.repeats, base)}
    path = save("prepare_contract", result)
    print(f"\nprofile on / off, median wall: {result['ratio_wall']} (target <= 1.10, "
          f"{'met' if result['met'] else 'MISSED'}); CPU: {result['ratio_cpu']}")
    if base:
        print(f"on / base (before the contract): wall {result['ratio_wall_vs_base']}, "
              f"CPU {result['ratio_cpu_vs_base']}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
