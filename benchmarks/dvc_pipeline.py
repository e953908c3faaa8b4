"""Pipeline overhead: a cold `dvc repro` of the project on the default data, then
its no-op `dvc repro` against a no-op `dvc repro` of an empty two-stage pipeline,
measured in the same run (median of N). Target: no-op within 1.5x of the empty one.

    .venv/bin/python benchmarks/dvc_pipeline.py [--repeats 5] [--skip-cold REPO] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
       "TF_CPP_MIN_LOG_LEVEL": "2"}
ENV.pop("MLFLOW_TRACKING_URI", None)


def sh(*args: str, cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    sh("git", "init", "-q", "-b", "main", cwd=path)
    sh("git", "config", "user.email", "bench@example.invalid", cwd=path)
    sh("git", "config", "user.name", "bench", cwd=path)
    return path


# --quick: a pipeline that reproduces in a fraction of the time (a check that the rows
# run, not a figure): no search, few epochs, a gate its model passes (the serving row
# needs an @production version).
QUICK_PARAMS = {"tune": {"enabled": False}, "train": {"epochs": 4},
                "prune": {"epochs": 2}, "quantize": {"qat_epochs": 1},
                "promote": {"gate": {"min_accuracy": 0.5}}}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def project_copy(dest: Path, params: dict | None = None) -> Path:
    """The project as a user has it: code, dvc.yaml, params.yaml (with `params`
    merged in), committed."""
    git_repo(dest)
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore",
                 "data/reference_profile.json"):  # a dependency of prepare
        if (ROOT / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    if params:
        import yaml

        merged = merge(yaml.safe_load((dest / "params.yaml").read_text()), params)
        (dest / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / ".dvc", dest / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    sh("git", "add", "-A", cwd=dest)
    sh("git", "commit", "-qm", "bench", cwd=dest)
    return dest


def empty_pipeline(dest: Path) -> Path:
    git_repo(dest)
    sh(str(BIN / "dvc"), "init", "-q", cwd=dest)
    (dest / "dvc.yaml").write_text(
        "stages:\n"
        "  first:\n    cmd: echo a > a.txt\n    outs: [a.txt]\n"
        "  second:\n    cmd: cp a.txt b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n"
    )
    sh(str(BIN / "dvc"), "repro", "-q", cwd=dest)
    return dest


def noop_seconds(repo: Path, repeats: int) -> float:
    return statistics.median(sh(str(BIN / "dvc"), "repro", cwd=repo) for _ in range(repeats))


def measure(repeats: int = 5, repo: Path | None = None,
            quick: bool = False) -> tuple[dict, Path]:
    work = Path(tempfile.mkdtemp(prefix="tfmlops-bench-dvc-"))
    result: dict = {"benchmark": "dvc_pipeline", "repeats": repeats, "quick": quick}
    if repo is None:
        repo = project_copy(work / "project", QUICK_PARAMS if quick else None)
        result["cold_repro_s"] = round(sh(str(BIN / "dvc"), "repro", cwd=repo), 1)
    empty = empty_pipeline(work / "empty")
    project_noop = noop_seconds(repo, repeats)
    empty_noop = noop_seconds(empty, repeats)
    result.update({
        "noop_repro_s": round(project_noop, 3),
        "empty_two_stage_noop_s": round(empty_noop, 3),
        "ratio": round(project_noop / empty_noop, 2),
        "target_ratio": 1.5,
        "met": project_noop / empty_noop <= 1.5,
        "repo": str(repo),
    })
    return result, repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-cold", type=Path, help="an already reproduced project copy")
    parser.add_argument("--quick", action="store_true",
                        help="reproduce a small pipeline (no search, few epochs), 1 repeat")
    args = parser.parse_args()
    result, _ = measure(1 if args.quick else args.repeats, args.skip_cold, args.quick)
    path = save("dvc_pipeline", result)
    cold = f"cold repro {result['cold_repro_s']} s; " if "cold_repro_s" in result else ""
    print(f"dvc pipeline: {cold}no-op {result['noop_repro_s']} s vs empty two-stage no-op "
          f"{result['empty_two_stage_noop_s']} s = {result['ratio']}x (target <= 1.5x: "
          f"{'met' if result['met'] else 'MISSED'}) -> {path}")


if __name__ == "__main__":
    main()
