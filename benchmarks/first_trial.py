"""tune's first trial score at a git revision: whether two revisions run the same search.

`cold_repro.py` compares revisions by stage time, which means something only when both
run the same search. This clones REV into a temp folder and runs materialize, prepare and
tune there (`tune.max_trials: 1`, `final_candidates: 0`, tracking and profiling off),
with the package from the clone's src, and prints trial 1's score and batch size. Along
`git rev-list --first-parent A..B` it bisects a change of the search (BENCHMARKS.md).

    .venv/bin/python benchmarks/first_trial.py REV
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def first_trial(rev: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="tfmlops-trial-") as tmp:
        clone = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", rev], cwd=clone, check=True)
        params = yaml.safe_load((clone / "params.yaml").read_text())
        params["tune"].update(max_trials=1, final_candidates=0)
        params["tracking"]["enabled"] = params["profiling"]["enabled"] = False
        (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        env = {**os.environ, "PYTHONPATH": str(clone / "src"), "TF_CPP_MIN_LOG_LEVEL": "3"}
        for stage in ("materialize", "prepare", "tune"):
            subprocess.run([sys.executable, "-m", "tfmlops", "-q", stage], cwd=clone, env=env,
                           check=True, stdout=subprocess.DEVNULL)
        trial = json.loads(next((clone / "data" / "tuner").rglob("trial.json")).read_text())
        return trial["score"], trial["hyperparameters"]["values"].get("batch_size")


if __name__ == "__main__":
    score, batch = first_trial(sys.argv[1])
    print(f"{sys.argv[1]} trial 1: score {score} batch_size {batch}")
