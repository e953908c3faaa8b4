"""How many fine-tuning epochs `prune` needs (issue 50): prune then quantize for each
schedule, on a project where tune and train already ran.

    .venv/bin/python benchmarks/prune_epochs.py PROJECT [--runs 30 15 10 6 4 3]
        [--runs 4,end_fraction=0.8,frequency=2 15,learning_rate=0.004,seed=43 ...]
        [--rounds 1] [--tracking]

PROJECT is a project folder whose `dvc repro train` (or `tfmlops train`) is done; its
prepared data and trained model are read, never rewritten: each run's params are the
project's params.yaml with `prune.epochs` (and any `KEY=VALUE` after the comma, a key of the
prune section, or `seed`: prune's and quantize's seed, the trained model staying) set,
`prune.stop_when_recovered` false unless a run sets it (each runs its whole schedule), and
with `paths.pruned`, `tflite`, `export`, `reports` and `profiles` moved into a scratch
folder, so neither tune nor train reruns and the project's own outputs stay as they were.
`tfmlops prune` and `tfmlops quantize` run as the pipeline runs them (one process each, the
project's profiling setting; tracking off unless `--tracking`), with the `tfmlops` of this
checkout (PYTHONPATH=src).

For each run it prints the pruned model's test accuracy and its drop against the trained
model, the sparsity, the epoch kept, quantize's edge variant, its bytes and its accuracy drop
against the trained Keras model (prune's and quantization's losses together, against
`quantize.accuracy_budget`), prune's fine-tune seconds and whole-process wall seconds, and
their ratios to the first run (the reference schedule, e.g. 30 epochs) measured in the same
invocation. A run passes when the pruned model and the edge file are both within the budget
and the edge variant and bytes equal the reference run's. With `--rounds 2` the list runs
again in reverse order (before and after alternated); times are then medians.

Writes reports/benchmarks/prune_epochs_<project folder name>.json (git-ignored; `--name`
names it otherwise). Each run's folder (its params, outputs and stages.log) is removed at the
end unless `--keep`; a failed run's stays.
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402

BIN = Path(sys.executable).parent
MOVED_PATHS = ("pruned", "tflite", "export", "reports", "profiles")
TOP_LEVEL = ("seed",)  # --runs keys set at the top of params.yaml, not in prune


def parse_run(spec: str) -> tuple[str, dict]:
    """'4,end_fraction=0.8' -> ('4,end_fraction=0.8', {'epochs': 4, 'end_fraction': 0.8,
    'stop_when_recovered': False}): a run fine-tunes its whole schedule unless it sets
    stop_when_recovered=true (the lengths compared are the schedules')."""
    first, *rest = spec.split(",")
    values = {"epochs": int(first), "stop_when_recovered": False}
    for item in rest:
        key, _, value = item.partition("=")
        if not value:
            raise SystemExit(f"--runs {spec}: expected EPOCHS[,KEY=VALUE...], e.g. 4,frequency=2")
        values[key.strip()] = yaml.safe_load(value)
    return spec, values


def run_params(project: Path, scratch: Path, prune: dict, tracking: bool) -> Path:
    params = yaml.safe_load((project / "params.yaml").read_text())
    prune = dict(prune)
    for key in TOP_LEVEL:  # not a prune key: e.g. seed=43, a second seed for prune (and quantize)
        if key in prune:
            params[key] = prune.pop(key)
    params["prune"].update(prune)
    for key in MOVED_PATHS:
        params["paths"][key] = str(scratch / Path(params["paths"][key]))
    params["tracking"]["enabled"] = tracking
    path = scratch / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def stage(project: Path, params: Path, name: str, log) -> float:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "tfmlops"), "--params", str(params), name], cwd=project,
                          env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tfmlops {name} failed (exit {done.returncode}): see {log.name}")
    return seconds


def one_run(project: Path, scratch: Path, prune: dict, tracking: bool) -> dict:
    scratch.mkdir(parents=True)
    params = run_params(project, scratch, prune, tracking)
    with open(scratch / "stages.log", "w") as log:
        prune_wall = stage(project, params, "prune", log)
        quantize_wall = stage(project, params, "quantize", log)
    cfg = yaml.safe_load(params.read_text())
    pruned = json.loads((Path(cfg["paths"]["reports"]) / "prune.json").read_text())
    edge = json.loads((Path(cfg["paths"]["tflite"]) / "edge.json").read_text())
    return {
        "prune": prune,
        "test_accuracy": pruned["test_accuracy"],
        "trained_test_accuracy": pruned["trained_test_accuracy"],
        "accuracy_delta": pruned["accuracy_delta"],
        "sparsity": pruned["sparsity"],
        "kept_epoch": pruned["kept_epoch"],
        "schedule": pruned["schedule"],
        "edge_variant": edge["variant"],
        "edge_bytes": edge["bytes"],
        "edge_accuracy": edge["accuracy"],
        "edge_delta": round(edge["accuracy"] - edge["reference_accuracy"], 6),
        "edge_within_budget": edge["within_budget"],
        "budget": edge["accuracy_budget"],
        "fine_tune_seconds": pruned["fine_tune_seconds"],
        "prune_wall_seconds": round(prune_wall, 2),
        "quantize_wall_seconds": round(quantize_wall, 2),
    }


def summarise(specs: list[str], rounds: list[dict]) -> list[dict]:
    rows = []
    for spec in specs:
        runs = [r[spec] for r in rounds]
        row = dict(runs[0])
        for key in ("fine_tune_seconds", "prune_wall_seconds", "quantize_wall_seconds"):
            row[key] = round(statistics.median(r[key] for r in runs), 2)
        # prune is seeded and deterministic: the rounds must agree on what it made
        row["same_in_every_round"] = all(
            (r["test_accuracy"], r["edge_variant"], r["edge_bytes"]) ==
            (row["test_accuracy"], row["edge_variant"], row["edge_bytes"]) for r in runs)
        rows.append({"run": spec, **row})
    ref = rows[0]
    for row in rows:
        row["fine_tune_ratio"] = round(row["fine_tune_seconds"] / ref["fine_tune_seconds"], 3)
        row["prune_wall_ratio"] = round(row["prune_wall_seconds"] / ref["prune_wall_seconds"], 3)
        row["passes"] = bool(
            row["accuracy_delta"] >= -row["budget"] - 1e-9 and row["edge_within_budget"]
            and (row["edge_variant"], row["edge_bytes"]) == (ref["edge_variant"], ref["edge_bytes"]))
    return rows


def table(rows: list[dict]) -> str:
    head = ("run", "pruned acc", "drop", "sparsity", "kept", "edge variant", "edge bytes",
            "edge drop", "fine-tune s", "ratio", "prune wall s", "ratio", "passes")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(v) for v in (
            r["run"], f"{r['test_accuracy']:.4f}", f"{r['accuracy_delta']:+.4f}",
            f"{r['sparsity']:.3f}", r["kept_epoch"], r["edge_variant"], f"{r['edge_bytes']:,}",
            f"{r['edge_delta']:+.4f}", r["fine_tune_seconds"], f"{r['fine_tune_ratio']:.2f}x",
            r["prune_wall_seconds"], f"{r['prune_wall_ratio']:.2f}x",
            "yes" if r["passes"] else "no")))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("project", type=Path, help="a project folder where tune and train ran")
    ap.add_argument("--runs", nargs="+", default=["30", "15", "10", "6", "4", "3"],
                    help="EPOCHS[,KEY=VALUE...] per run (prune keys); the first is the reference")
    ap.add_argument("--rounds", type=int, default=1, help="even rounds run the list reversed")
    ap.add_argument("--tracking", action="store_true", help="keep the project's tracking on")
    ap.add_argument("--keep", action="store_true", help="keep each run's scratch folder")
    ap.add_argument("--name", help="results file name (default: prune_epochs_<project folder>)")
    args = ap.parse_args()
    project = args.project.resolve()
    if not (project / "params.yaml").is_file():
        raise SystemExit(f"{project}: no params.yaml; pass a project folder where train ran")
    runs = dict(parse_run(s) for s in args.runs)
    scratch = Path(tempfile.mkdtemp(prefix="prune-epochs-"))
    rounds = []
    for n in range(args.rounds):
        order = list(runs) if n % 2 == 0 else list(reversed(runs))
        results = {}
        for spec in order:
            folder = scratch / f"round{n}" / spec.replace(",", "_").replace("=", "-")
            load = os.getloadavg()[0]
            results[spec] = {**one_run(project, folder, runs[spec], args.tracking),
                             "load_at_start": round(load, 2)}
            r = results[spec]
            print(f"round {n + 1} {spec}: pruned {r['test_accuracy']:.4f} "
                  f"({r['accuracy_delta']:+.4f}), edge {r['edge_variant']} {r['edge_bytes']} "
                  f"({r['edge_delta']:+.4f}), fine-tune {r['fine_tune_seconds']} s, "
                  f"load {load:.2f}", flush=True)
        rounds.append(results)
    rows = summarise(list(runs), rounds)
    print(table(rows))
    passing = [r for r in rows if r["passes"]]
    fewest = min(passing, key=lambda r: (r["prune"]["epochs"], r["fine_tune_seconds"]),
                 default=None)
    print(f"fewest passing: {fewest['run'] if fewest else 'none'}")
    out = save(args.name or f"prune_epochs_{project.name}",
               {"project": str(project), "rounds": args.rounds, "rows": rows})
    print(f"written: {out}")
    if args.keep:
        print(f"runs kept in {scratch}")
    else:
        shutil.rmtree(scratch)  # a failed run's folder stays: its stages.log says why


if __name__ == "__main__":
    main()
