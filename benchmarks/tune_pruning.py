"""tune's search with `tune.pruning` off and on, alternated on one machine (issue 50).

    .venv/bin/python benchmarks/tune_pruning.py [--image-dir /work/bench/photos1k]
        [--image-size 96] [--channels 3] [--rounds 2] [--rule median|halving]
        [--set tune.max_trials=6 ...] [--scratch DIR]

One scratch project (tracking and profiling off, `tune.final_candidates: 0`: the search is
what is measured) is prepared once (the built-in digits without --image-dir); then each
round runs `tfmlops tune` in its own process with `tune.pruning.rule` off and --rule, in
alternating order, each from an empty `paths.tuner` (a cold search). Prints per side the
search's seconds (reports/tune.json `search_seconds`) and the tune process's CPU seconds
(steadier than wall time where other jobs share the cores), the best score and trial, the
trials stopped by the pruner, whether both sides' best trials have the same values, and
the on/off ratio of the median search seconds. Target (issue 50): best score no lower,
ratio <= 0.6. Writes reports/benchmarks/tune_pruning.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save, scratch_config  # noqa: E402

HP_SKIP = ("tuner/",)  # hyperband's bookkeeping values, not a configuration


def tfmlops(workdir: Path, *args: str) -> tuple[float, float]:
    """Run `tfmlops ARGS` in `workdir` with this checkout's code; its wall and CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("MLFLOW_TRACKING_URI", None)
    started, cpu = time.perf_counter(), _children_cpu()
    with open(workdir / f"{args[0]}.log", "a") as out:
        code = subprocess.run([sys.executable, "-m", "tfmlops", "--params", "params.yaml", *args],
                              cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"tfmlops {' '.join(args)} failed ({code}): see {workdir}/{args[0]}.log")
    return time.perf_counter() - started, _children_cpu() - cpu


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: on a shared machine a
    steadier measure of the work done than wall time, which other jobs stretch."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def project(scratch: Path, image_dir: str | None, size: int, channels: int,
            overrides: dict) -> Path:
    """The scratch project, prepared (kept for a rerun with --scratch)."""
    params = scratch / "params.yaml"
    if not params.is_file():
        data = {"image_dir": image_dir, "image_size": size, "channels": channels} if image_dir \
            else {}
        scratch_config(scratch, data=data)
    tree = yaml.safe_load(params.read_text())
    tree["tune"]["final_candidates"] = 0
    for dotted, value in overrides.items():
        node = tree
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = yaml.safe_load(value)
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    if not (scratch / "data" / "prepared").is_dir():
        if not image_dir:
            tfmlops(scratch, "materialize")
        tfmlops(scratch, "prepare")
    return scratch


def search_once(workdir: Path, rule: str) -> dict:
    """One cold search with tune.pruning.rule `rule`."""
    params = workdir / "params.yaml"
    tree = yaml.safe_load(params.read_text())
    tree["tune"].setdefault("pruning", {})["rule"] = rule
    params.write_text(yaml.safe_dump(tree, sort_keys=False))
    for folder in (tree["paths"]["tuner"], tree["paths"]["tuned"]):
        shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()[0]
    wall, cpu = tfmlops(workdir, "tune")
    reports = Path(tree["paths"]["reports"])
    metrics = json.loads((reports / "tune.json").read_text())
    with (reports / "tune_trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    best = next(r for r in rows if r["trial"] == str(metrics["best_trial"]))
    hp_names = [c for c in best if c not in ("trial", "baseline", "score", "status", "epochs",
                                             "best_epoch", "stopped_at_epoch", "seconds")]
    return {"rule": rule, "search_seconds": metrics["search_seconds"], "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
            "load_at_start": round(load, 2), "best_score": metrics["best_score"],
            "best_trial": metrics["best_trial"], "trials": metrics["trials"],
            "trials_pruned": metrics.get("trials_pruned", 0),
            "best_values": {k: best[k] for k in hp_names if best[k] != ""}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-dir", default=None, help="photos (default: built-in digits)")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rule", default="median", choices=("median", "halving"),
                        help="the rule measured against off")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params override on both sides, e.g. tune.max_trials=6")
    parser.add_argument("--scratch", type=Path, default=None)
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="tfmlops-tune-pruning-"))
    scratch.mkdir(parents=True, exist_ok=True)
    workdir = project(scratch, args.image_dir, args.image_size, args.channels, overrides)
    runs, on = [], args.rule
    for rnd in range(args.rounds):
        for rule in (("off", on) if rnd % 2 == 0 else (on, "off")):
            runs.append({"round": rnd, **search_once(workdir, rule)})
            print(json.dumps(runs[-1]), flush=True)
    side = {rule: [r for r in runs if r["rule"] == rule] for rule in ("off", on)}
    median = {rule: statistics.median(r["search_seconds"] for r in rs) for rule, rs in side.items()}
    ratio = round(median[on] / median["off"], 3)
    cpu = {rule: statistics.median(r["cpu_seconds"] for r in rs) for rule, rs in side.items()}
    cpu_ratio = round(cpu[on] / cpu["off"], 3)
    same_values = len({json.dumps(r["best_values"], sort_keys=True) for r in runs}) == 1
    no_worse = min(r["best_score"] for r in side[on]) >= max(
        r["best_score"] for r in side["off"])
    result = {"benchmark": "tune_pruning", "data": args.image_dir or "digits", "rule": on,
              "overrides": overrides, "runs": runs, "median_search_seconds": median,
              "ratio_on_off": ratio, "median_cpu_seconds": cpu, "cpu_ratio_on_off": cpu_ratio,
              "same_best_values": same_values,
              "best_score_no_lower": no_worse, "scratch": str(scratch)}
    path = save("tune_pruning", result)
    print(f"\nsearch seconds, median of {args.rounds}: off {median['off']:.1f}, "
          f"{on} rule {median[on]:.1f}: ratio {ratio} (target <= 0.6: "
          f"{'met' if ratio <= 0.6 else 'MISSED'})")
    print(f"tune process CPU seconds, median: off {cpu['off']:.1f}, {on} rule "
          f"{cpu[on]:.1f}: ratio {cpu_ratio}")
    print(f"best score off {[r['best_score'] for r in side['off']]}, "
          f"on {[r['best_score'] for r in side[on]]}: no lower: {no_worse}; "
          f"the same best trial values: {same_values}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
