"""Wall time of promote's evaluation: the candidate and @production, each through its
registered serving files, on the same current test split (stages/promote/versions.py).

Takes a workdir where `export` registered a version (a `dvc repro` through export,
e.g. the photo benchmark's), or builds one on digits with the repo's params and
short stages (tune off, train 3 epochs, prune 1 epoch, INT8 only; the model's
quality does not change the evaluation's cost), then times `evaluate_versions` of
the exported version against itself as production (two passes over the split,
both downloads, the plots and the per-image table), `--rounds` times, and prints
the median, images per second and the peak RSS of this process.

    .venv/bin/python benchmarks/promote_evaluation.py                 # digits, built here
    .venv/bin/python benchmarks/promote_evaluation.py --workdir /tmp/run4k  # a finished run

Writes reports/benchmarks/promote_evaluation.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, save  # noqa: E402

SHORT = {"tune": {"enabled": False}, "train": {"epochs": 3}, "prune": {"epochs": 1},
         "quantize": {"variants": ["int8"], "latency_runs": 20},
         "export": {"latency_runs": 20}, "profiling": {"enabled": False}}


def build_digits(workdir: Path) -> Path:
    """The repo's params on digits (32 px), short stages, tracking to a SQLite store here."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in SHORT.items():
        params[section].update(values)
    params["tracking"]["uri"] = f"sqlite:///{workdir / 'mlflow.db'}"
    params["paths"] = {k: str(workdir / v) for k, v in params["paths"].items()}
    params["data"]["image_dir"] = params["paths"]["builtin"]
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    tfmlops = Path(sys.executable).parent / "tfmlops"
    for stage in ("materialize", "prepare", "tune", "train", "prune", "quantize", "export"):
        started = time.perf_counter()
        subprocess.run([str(tfmlops), stage], cwd=workdir, check=True, capture_output=True)
        print(f"built {stage} in {time.perf_counter() - started:.0f} s", flush=True)
    return workdir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="a finished run (default: digits, built here)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="promote_evaluation")
    args = ap.parse_args()

    from tfmlops.config import load_config

    workdir = args.workdir or build_digits(Path(tempfile.mkdtemp(prefix="tfmlops-bench-eval-")))
    cfg = load_config(workdir / "params.yaml")
    from tfmlops.registry import Registry
    from tfmlops.stages.promote.versions import evaluate_versions

    version = json.loads((Path(cfg.paths.export) / "registered.json").read_text())["version"]
    registry = Registry(cfg)
    times, summary = [], {}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            summary = evaluate_versions(cfg, registry, version, version, Path(out))
            times.append(time.perf_counter() - started)
    images = summary["images"]
    result = {"workdir": str(workdir), "images": images, "versions": 2,
              "runtime": summary["candidate"]["runtime"], "seconds": [round(t, 2) for t in times],
              "median_s": round(statistics.median(times), 2),
              "images_per_s": round(2 * images / statistics.median(times), 1),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    print(json.dumps(result, indent=2))
    print(f"saved {save(args.name, result)}")


if __name__ == "__main__":
    main()
