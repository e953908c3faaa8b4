"""The default pipeline's test accuracy over several seeds, tune included (issue 13).

Each seed is a fresh copy of the project (code, dvc.yaml, params.yaml with only
`seed` changed) reproduced cold with `dvc repro` on the default digits. Reports
each seed's test accuracy (reports/train.json) and cold repro time, and their
mean and min. Target: mean >= 0.992.

    .venv/bin/python benchmarks/quality.py [--seeds 42 43 44]

Writes reports/benchmarks/quality.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402
from dvc_pipeline import BIN, project_copy, sh  # noqa: E402

TARGET_MEAN = 0.992


def one_seed(seed: int, work: Path) -> dict:
    repo = project_copy(work / f"seed-{seed}", {"seed": seed})
    seconds = sh(str(BIN / "dvc"), "repro", cwd=repo)
    train = json.loads((repo / "reports" / "train.json").read_text())
    return {"seed": seed, "test_accuracy": round(train["test_accuracy"], 4),
            "cold_repro_s": round(seconds, 1), "repo": str(repo)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfmlops-bench-quality-"))
    runs = []
    for seed in args.seeds:
        runs.append(one_seed(seed, work))
        print(f"seed {seed}: test accuracy {runs[-1]['test_accuracy']}, cold dvc repro "
              f"{runs[-1]['cold_repro_s']} s", flush=True)
    accuracies = [r["test_accuracy"] for r in runs]
    mean = statistics.mean(accuracies)
    result = {"benchmark": "quality", "runs": runs, "mean_test_accuracy": round(mean, 4),
              "min_test_accuracy": min(accuracies), "target_mean": TARGET_MEAN,
              "met": mean >= TARGET_MEAN}
    path = save("quality", result)
    print(f"test accuracy over {len(runs)} seeds: mean {result['mean_test_accuracy']}, min "
          f"{result['min_test_accuracy']} (target mean >= {TARGET_MEAN}: "
          f"{'met' if result['met'] else 'MISSED'}) -> {path}")


if __name__ == "__main__":
    main()
