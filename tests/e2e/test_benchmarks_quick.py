"""`benchmarks/run.py --quick` (BENCHMARKS.md's check that every row runs) in a copy of
the session's reproduced pipeline: every row runs, is written and is summarised.

Its figures are not asserted (tests never assert times); what is checked is that each
row ran on the project it was given and produced the ratio BENCHMARKS.md quotes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, child_env, repo_copy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

ROWS = ("dvc_pipeline", "input_pipeline", "training_throughput", "inference",
        "training_tracking", "training_scaling", "serving")


def test_every_benchmark_row_runs_quick(pipeline_repo, tmp_path):
    # The copy is the benchmarks' project root (they write reports/benchmarks/ under it,
    # never into the checkout); --skip-cold: the session's pipeline is the cold repro.
    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    shutil.copytree(ROOT / "benchmarks", repo / "benchmarks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "tests").mkdir()
    shutil.copy2(ROOT / "tests" / "local_server.py", repo / "tests" / "local_server.py")
    checkout_before = written(ROOT)
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--skip-cold",
                           str(repo)], cwd=repo, env=child_env(), capture_output=True,
                          text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    results = json.loads((repo / "reports" / "benchmarks" / "run_quick.json").read_text())
    assert results["quick"] is True and results["dvc_pipeline"]["repo"] == str(repo)
    for row in ROWS:
        assert results[row]["seconds"] > 0, row
    # the served runtime was measured beside the fastest one that passed parity
    assert results["inference"]["served_runtime"].startswith(("tflite", "onnx", "saved_model"))
    for ratio in (results["inference"]["served_p50_vs_fastest_faithful"],
                  results["input_pipeline"]["ratio"], results["training_throughput"]["ratio"],
                  results["dvc_pipeline"]["ratio"], results["serving"]["eight_over_one_client"]):
        assert ratio > 0
    assert "--quick: small sizes" in proc.stdout
    assert written(ROOT) == checkout_before, "the benchmarks wrote into the checkout"


def written(root) -> dict:
    """Every file under root/reports/benchmarks with its mtime."""
    return {str(p): p.stat().st_mtime_ns for p in (root / "reports" / "benchmarks").rglob("*")}
