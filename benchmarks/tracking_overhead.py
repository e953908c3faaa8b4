"""Tracking's cost per stage: each stage's whole process with tracking on vs off.

Every stage runs as `dvc repro` runs it, `tfmlops <stage>` in a fresh process (so
the MLflow import is paid each time), on the built-in digits with tiny params, in
a scratch folder; tracking on records into a SQLite store there. Per round and
stage, off and on one after the other, their order swapped every round (neither
side gets the quieter machine), except export beside promote: its on run comes
last so that promote finds the model it registered. Printed: per stage the median wall time
on and off over the rounds and their ratio (target: at most +3% each), and the
ratio of the best times (less sensitive to a busy machine). `promote` has no off
mode (it needs the registry): its time on is printed alone. Profiling is off in
both. `--defaults` runs params.yaml's params instead (tune's whole search, train's
epochs): the stages as a user's `dvc repro` runs them.

A stage's time is until its process exits, what `dvc repro` waits for. prepare hands
its run to its tracking sidecar and exits (tracking.wait: false); when the sidecar
delivers after that, both times are printed, and the next run starts after delivery.

`--upstream tune,train,prune,quantize` runs those once first, tracking off, so that
many rounds of one late stage (`--stages export`) cost only its own runs; without
promote, export's sides alternate too.

    .venv/bin/python benchmarks/tracking_overhead.py [--rounds 3] [--stages prepare,train]
        [--defaults] [--upstream tune,train] [--workdir /tmp/tfmlops-bench-XXXX]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save, scratch_config  # noqa: E402

STAGES = ("prepare", "tune", "train", "prune", "quantize", "export", "promote")
ONLY_ON = {"promote"}  # refuses to run with tracking off
# The gate of the tiny model (it scores below the default floor): promote decides either way.
PROMOTE = {"promote": {"gate": {"min_accuracy": 0.0, "max_regression": 1.0,
                                "max_latency_ms": 1000.0}}}


def scratch(workdir: Path | None = None, defaults: bool = False) -> Path:
    """A scratch folder whose params are the tests' tiny ones (conftest.TINY: a round
    takes minutes on 2 cores) or, `defaults`, params.yaml's as `dvc repro` runs them;
    tracking off."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TINY, deep_merge

    _, workdir = scratch_config(workdir)
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params = deep_merge(params if defaults else deep_merge(params, TINY), PROMOTE)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return workdir


def param_files(workdir: Path) -> dict[str, Path]:
    """params.yaml (tracking off, as scratch_config writes it) and params_on.yaml."""
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["tracking"].update(enabled=True, uri=f"sqlite:///{workdir / 'mlflow.db'}")
    (workdir / "params_on.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return {"off": workdir / "params.yaml", "on": workdir / "params_on.yaml"}


def timed(stage: str, params: Path, workdir: Path, env: dict[str, str]) -> float:
    """Seconds until `tfmlops <stage>` exits: what `dvc repro` waits for before the next
    stage. prepare's tracking sidecar may deliver its run after that (tracking.wait:
    false); its delivery is waited for before the next run, and printed."""
    from tfmlops.artifacts import run_dir
    from tfmlops.config import load_config
    from tfmlops.tracking.lineage import wait_delivered

    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tfmlops", "-q", "--params", str(params), stage],
                            cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    # stderr read in a thread: the stage must never block on a full pipe
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    proc.wait()
    seconds = time.perf_counter() - start
    reader.join()
    # as a later stage does: the sidecar that delivers after the exit holds the lock
    wait_delivered(run_dir(load_config(params), stage))
    delivered = time.perf_counter() - start
    if delivered - seconds > 0.05:
        print(f"  {stage} ({params.name}): exited at {seconds:.2f} s, its run delivered at "
              f"{delivered:.2f} s", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"tfmlops {stage} ({params.name}) exited {proc.returncode}: "
                         f"{err[0].strip().splitlines()[-1:]}")
    return round(seconds, 2)


def measure(stages: tuple[str, ...], rounds: int, defaults: bool = False,
            upstream: tuple[str, ...] = (), workdir: Path | None = None) -> dict:
    workdir = scratch(workdir, defaults=defaults)
    files = param_files(workdir)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    timed("materialize", files["off"], workdir, env)
    timed("prepare", files["off"], workdir, env)  # warm: a first prepare decodes everything
    for stage in upstream:
        print(f"  upstream {stage}: {timed(stage, files['off'], workdir, env):.1f} s", flush=True)
    seconds: dict[str, dict[str, list[float]]] = {s: {"off": [], "on": []} for s in stages}
    for n in range(rounds):
        for stage in stages:
            last = stage == "export" and "promote" in stages  # promote reads its version
            sides = ("off", "on") if n % 2 == 0 or last else ("on", "off")
            for side in ("on",) if stage in ONLY_ON else sides:
                if stage == "tune":  # a fresh search each time: a finished one would resume
                    shutil.rmtree(workdir / "data" / "tuner", ignore_errors=True)
                seconds[stage][side].append(timed(stage, files[side], workdir, env))
    rows = []
    for stage in stages:
        on = statistics.median(seconds[stage]["on"])
        off = statistics.median(seconds[stage]["off"]) if seconds[stage]["off"] else None
        best = None if off is None else min(seconds[stage]["on"]) / min(seconds[stage]["off"])
        rows.append({"stage": stage, "on_s": round(on, 2),
                     "off_s": None if off is None else round(off, 2),
                     "ratio": None if off is None else round(on / off, 3),
                     "best_ratio": None if best is None else round(best, 3)})
    return {"rows": rows, "rounds": rounds, "target_ratio": 1.03, "all_seconds": seconds,
            "met": all(r["ratio"] is None or r["ratio"] <= 1.03 for r in rows),
            "what": "`tfmlops <stage>` wall time, one process per run, median over rounds"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="comma-separated, in pipeline order (each needs its upstream's)")
    parser.add_argument("--defaults", action="store_true",
                        help="params.yaml's params as `dvc repro` runs them, not the tests' tiny ones")
    parser.add_argument("--upstream", default="",
                        help="comma-separated stages run once first, tracking off (not measured)")
    parser.add_argument("--workdir", type=Path,
                        help="an earlier run's scratch folder, its outputs reused (upstream done)")
    args = parser.parse_args()
    stages = tuple(s for s in args.stages.split(",") if s)
    result = {"benchmark": "tracking_overhead", "params": "defaults" if args.defaults else "tiny",
              **measure(stages, args.rounds, args.defaults,
                        tuple(s for s in args.upstream.split(",") if s), args.workdir)}
    path = save("tracking_overhead", result)
    lines = [f"{'stage':<10} {'on s':>8} {'off s':>8} {'on/off':>8} {'best on/off':>12}"]
    for r in result["rows"]:
        off, ratio, best = ("-" if r[k] is None else f"{r[k]:.{d}f}"
                            for k, d in (("off_s", 2), ("ratio", 3), ("best_ratio", 3)))
        lines.append(f"{r['stage']:<10} {r['on_s']:>8.2f} {off:>8} {ratio:>8} {best:>12}")
    lines.append(f"median of {result['rounds']} round(s); target on/off <= 1.03 -> {path}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
