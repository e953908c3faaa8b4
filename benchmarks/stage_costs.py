"""Where a cold `dvc repro`'s seconds go, per stage: measured, at any revision.

    .venv/bin/python benchmarks/stage_costs.py REV [REV ...] [--set tune.enabled=false]
        [--rounds 1] [--target prepare]

Each run is benchmarks/cold_repro.py's: a fresh clone of REV, no cache or store carried
over, `dvc repro` with the shared venv's tools and the clone's package. On top of it,
benchmarks/stage_probe/ goes first on PYTHONPATH: its `sitecustomize` samples every
Python process's main thread (DVC's aside) every 5 ms and files each interval under the
first rule that matches the stack, the outermost call owning what it calls:

  start       process start (/proc) until Python runs site-packages: the interpreter
  imports     any frame importing (importlib); split by the top-level package loaded
  mlflow      mlflow's code, or tfmlops/tracking (waiting for the sidecar included)
  conversion  tf2onnx, a TFLite converter's convert, Keras export, SavedModel save
  fit         a Keras fit (Keras 3 or tf_keras)
  evaluation  Keras predict/evaluate, ONNX Runtime, an interpreter's invoke, a pyfunc's
              predict, tfmlops/evaluation.py and runtimes.py
  writing     Keras save, h5py, tfmlops/files.py, matplotlib
  data        tfmlops/data, PIL, iterating a tf.data dataset outside fit/evaluation
  other       the rest (the stage's own Python, TensorFlow's graph building, ...)
  dvc         the stage's wall time in DVC's log ("Running stage" to the next) minus its
              process's: DVC hashing and caching outputs, and Python's teardown after
              the atexit handlers (seconds for a TensorFlow process on a busy machine)

A stage's child processes (its tracking sidecar, export's reload check, pool workers) run
beside it: their wall time is shown apart ("children"), not added. Rules match a stack,
not a revision's code: the same rules measure b0a5723 and today. The sampler adds CPU:
a pure-Python loop took 4-8% more CPU time with it (3 pairs); the figures are upper bounds
by about that much.

Prints one table per revision (median of the rounds per cell) and writes
reports/benchmarks/stage_costs.json; the runs' logs go to reports/benchmarks/stage_costs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_repro import BIN, STAGE_LINE, cold_clone, git  # noqa: E402
from common import RESULTS, ROOT, machine  # noqa: E402

PROBE = Path(__file__).resolve().parent / "stage_probe"
OUT = RESULTS / "stage_costs.json"
LOGS = RESULTS / "stage_costs"
COLUMNS = ("start", "imports", "mlflow", "data", "fit", "conversion", "evaluation", "writing",
           "other", "dvc")


def stage_of(record: dict) -> str | None:
    """The stage a `tfmlops <stage>` process ran (its console script's argv)."""
    argv = record["argv"]
    if argv and os.path.basename(argv[0]) == "tfmlops":
        return next((a for a in argv[1:] if not a.startswith("-")), None)
    return None


def per_stage(records: list[dict], walls: dict[str, float]) -> dict[str, dict]:
    """Each stage's categories (its own process), its sidecar's wall time and DVC's share."""
    by_pid = {r["pid"]: r for r in records}

    def owner(record):  # the stage process a record descends from
        seen = 0
        while record is not None and seen < 20:
            if stage_of(record):
                return record
            record, seen = by_pid.get(record["ppid"]), seen + 1
        return None

    stages: dict[str, dict] = {}
    for record in records:
        top = owner(record)
        if top is None:
            continue
        name = stage_of(top)
        row = stages.setdefault(name, {"imports_by": {}, "children_s": 0.0})
        wall = record["ended"] - (record["started"] or record["site"])
        if record is top:
            row["process_s"] = round(wall, 2)
            row["start"] = record["start_s"] or 0.0
            for cat, s in record["seconds"].items():
                if cat.startswith("imports:"):
                    row["imports"] = row.get("imports", 0.0) + s
                    pkg = cat.split(":", 1)[1]
                    row["imports_by"][pkg] = round(row["imports_by"].get(pkg, 0.0) + s, 2)
                else:
                    row[cat] = row.get(cat, 0.0) + s
        else:
            row["children_s"] += wall  # the sidecar, pool workers: beside the stage
    stages = {name: stages[name] for name in [*walls, *stages] if name in stages}  # DVC's order
    for name, row in stages.items():
        if name in walls and "process_s" in row:
            row["dvc"] = max(0.0, walls[name] - row["process_s"])
            row["stage_s"] = walls[name]
        for key in (*COLUMNS, "children_s"):
            if key in row:
                row[key] = round(row[key], 2)
    return stages


def cold_run(sha: str, overrides: list[str], log_path: Path, target: list[str]) -> dict:
    """One cold `dvc repro` at `sha` with the probe: DVC's stage walls and the probe's records."""
    parent = Path(tempfile.mkdtemp(prefix="tfmlops-costs-"))
    probes = parent / "probes"
    probes.mkdir()
    try:
        copy, env, _ = cold_clone(sha, parent, overrides)
        env["PYTHONPATH"] = f"{PROBE}{os.pathsep}{env['PYTHONPATH']}"
        env["STAGE_COSTS_DIR"] = str(probes)
        load = os.getloadavg()
        starts: list[tuple[str, float]] = []
        start = time.perf_counter()
        with log_path.open("w", buffering=1) as log:
            proc = subprocess.Popen([str(BIN / "dvc"), "repro", *target], cwd=copy, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
            for line in proc.stdout:
                now = time.perf_counter()
                log.write(f"{now - start:9.2f} {line}")
                if match := STAGE_LINE.search(line):
                    starts.append((match.group(1), now))
            code = proc.wait()
        end = time.perf_counter()
        records = [json.loads(p.read_text()) for p in sorted(probes.glob("*.json"))]
        reports = {p.stem: json.loads(p.read_text())
                   for p in sorted((copy / "reports").glob("*.json"))}
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    bounds = [t for _, t in starts[1:]] + [end]
    walls = {name: round(stop - t, 2) for (name, t), stop in zip(starts, bounds, strict=True)}
    return {"sha": sha, "set": overrides, "returncode": code, "load_avg": [round(x, 2) for x in load],
            "total_s": round(end - start, 1), "stages": per_stage(records, walls),
            "reports": reports, "log": str(log_path)}


def table(runs: list[dict]) -> str:
    """Median per cell over the runs of one revision."""
    names = list(dict.fromkeys(n for r in runs for n in r["stages"]))
    cols = ("stage_s", *COLUMNS, "children_s")
    lines = [f"{'':12}" + "".join(f"{c.removesuffix('_s'):>11}" for c in cols)]
    totals = dict.fromkeys(cols, 0.0)
    for name in names:
        cells = []
        for c in cols:
            values = [r["stages"][name].get(c, 0.0) for r in runs if name in r["stages"]]
            med = statistics.median(values) if values else 0.0
            totals[c] += med
            cells.append(f"{med:11.1f}")
        lines.append(f"{name:12}" + "".join(cells))
    lines.append(f"{'sum':12}" + "".join(f"{totals[c]:11.1f}" for c in cols))
    imports: dict[str, float] = {}
    for r in runs:
        for row in r["stages"].values():
            for pkg, s in row.get("imports_by", {}).items():
                imports[pkg] = imports.get(pkg, 0.0) + s / len(runs)
    top = sorted(imports.items(), key=lambda kv: -kv[1])[:8]
    lines.append("imports, all stages, by package: " + ", ".join(f"{k} {v:.1f}" for k, v in top))
    lines.append("totals (dvc repro): " + ", ".join(f"{r['total_s']:.1f} s (load {r['load_avg'][0]})"
                                                   for r in runs))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="git revisions (each a fresh clone)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs per revision, the revisions alternated in each round")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params.yaml value for every revision (dotted key, YAML value)")
    parser.add_argument("--target", action="append", default=[],
                        help="run `dvc repro TARGET` (and what it depends on) instead of all")
    args = parser.parse_args()
    revs = {rev: git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=ROOT) for rev in args.revs}
    LOGS.mkdir(parents=True, exist_ok=True)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    runs: list[dict] = []
    for round_no in range(1, args.rounds + 1):
        order = list(revs) if round_no % 2 else list(reversed(revs))
        for rev in order:
            sha = revs[rev]
            print(f"round {round_no}/{args.rounds}: {rev} ({sha[:7]}) ...", flush=True)
            run = cold_run(sha, args.set, LOGS / f"r{round_no}-{sha[:7]}.log", args.target)
            runs.append(run)
            OUT.write_text(json.dumps({"benchmark": "stage_costs", "command": command,
                                       "machine": machine(), "revisions": revs, "runs": runs},
                                      indent=2) + "\n")
            if run["returncode"] != 0:
                raise SystemExit(f"dvc repro failed at {sha[:7]} (exit {run['returncode']}): "
                                 f"see {run['log']}")
            print(f"  {run['total_s']:.1f} s", flush=True)
    for rev, sha in revs.items():
        print(f"\n{rev} ({sha[:7]}), seconds per stage (median of {args.rounds}):")
        print(table([r for r in runs if r["sha"] == sha]))
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
