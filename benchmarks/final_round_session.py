"""tune's final round with and without `keras.backend.clear_session()` before each
finalist, alternated, each a cold `tfmlops tune` process in its own scratch folder
(issue 50: the round's fit of the params entry took 55 s against train's 33 s for the
same epochs).

    .venv/bin/python benchmarks/final_round_session.py [--rounds 1] [--trials 6]
        [--epochs 6]

Default params, except tune.max_trials/train.epochs (smaller: the machine is shared) and
tracking off. Per arm: the params finalist's median epoch time after its first epoch
(from its kept history, data/tuner/final/params/history.json) and whether the final
round's numbers (final_round.csv without seconds) equal the other arm's. Then one
`tfmlops train --fresh` in the last folder: a fresh process's epoch time for the same fit.
Writes reports/benchmarks/final_round_session.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine, scratch_config  # noqa: E402

BIN = Path(sys.executable).parent
OUT = RESULTS / "final_round_session.json"
# The arm without it: the hook that clears is replaced by a no-op before the CLI runs.
NO_CLEAR = ("import tfmlops.stages.tune.final_fit as f; f.fresh_keras_state = lambda keras: None; "
            "from tfmlops.cli import entry; entry()")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}


def steady(rows: list[dict]) -> float:
    return statistics.median(r["epoch_seconds"] for r in rows[1:] or rows)


def untimed(path: Path) -> list[dict]:
    with path.open() as fh:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(fh)]


def tune(prepared: Path, arm: str, args) -> dict:
    _, work = scratch_config(tune={"max_trials": args.trials}, train={"epochs": args.epochs})
    shutil.copytree(prepared, work / "data" / "prepared")
    cmd = ([str(BIN / "python"), "-c", NO_CLEAR, "tune"] if arm == "no_clear"
           else [str(BIN / "python"), "-m", "tfmlops", "tune"])
    started = time.perf_counter()
    subprocess.run(cmd, cwd=work, env=env(), check=True, capture_output=True)
    rows = json.loads((work / "data" / "tuner" / "final" / "params" / "history.json").read_text())
    return {"arm": arm, "work": str(work), "tune_s": round(time.perf_counter() - started, 1),
            "params_epoch_s": round(steady(rows), 3), "load_avg": os.getloadavg()[0],
            "final_round": untimed(work / "models" / "tuned" / "final_round.csv")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    _, base = scratch_config()
    for command in ("materialize", "prepare"):
        subprocess.run([str(BIN / "python"), "-m", "tfmlops", command], cwd=base, env=env(),
                       check=True, capture_output=True)
    runs = []
    for n in range(args.rounds):
        for arm in (("no_clear", "clear") if n % 2 == 0 else ("clear", "no_clear")):
            runs.append(tune(base / "data" / "prepared", arm, args))
            print(f"{arm}: params finalist {runs[-1]['params_epoch_s']} s/epoch", flush=True)
    last = Path(runs[-1]["work"])
    subprocess.run([str(BIN / "python"), "-m", "tfmlops", "train", "--fresh"], cwd=last,
                   env=env(), check=True, capture_output=True)
    with (last / "reports" / "train_history.csv").open() as fh:
        fresh = steady([{"epoch_seconds": float(r["epoch_seconds"])} for r in csv.DictReader(fh)])
    med = {a: statistics.median(r["params_epoch_s"] for r in runs if r["arm"] == a)
           for a in ("no_clear", "clear")}
    same = all(r["final_round"] == runs[0]["final_round"] for r in runs)
    print(f"params finalist s/epoch: no clear_session {med['no_clear']:.3f}, clear_session "
          f"{med['clear']:.3f} (ratio {med['clear'] / med['no_clear']:.2f}); train --fresh "
          f"{fresh:.3f}; final round numbers equal across arms: {same}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"benchmark": "final_round_session", "machine": machine(),
                               "runs": runs, "train_fresh_epoch_s": fresh, "medians": med,
                               "final_round_equal": same}, indent=2, default=str) + "\n")
    for path in {Path(r["work"]) for r in runs} | {base}:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
