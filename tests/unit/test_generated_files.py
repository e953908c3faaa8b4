"""What a run makes stays out of git (issue 51): the stages' outputs, which DVC caches and
pushes (a committed copy puts stale figures on `dvc exp show`'s row of its commit, and
DVC refuses an output git tracks), and the benchmarks' results (BENCHMARKS.md quotes
them). Checked on the checkout the tests run from."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from conftest import ROOT, committed_params

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(),
                                reason="not a git checkout (an sdist): git tracks nothing")

# Where every benchmark writes its results (benchmarks/common.py's RESULTS)
BENCHMARK_RESULTS = "reports/benchmarks"


def git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return out.splitlines()


def dvc_outputs() -> list[str]:
    """Every path dvc.yaml declares as an output (outs, metrics, plots), `${paths.x}`
    filled in from params.yaml."""
    paths = committed_params()["paths"]
    found = []
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                path = entry if isinstance(entry, str) else next(iter(entry))
                found.append(re.sub(r"\$\{paths\.(\w+)\}", lambda m: paths[m.group(1)], path))
    assert found and not [p for p in found if "${" in p], found
    return found


def test_git_tracks_no_report_and_no_dvc_output():
    assert git("ls-files", "--", "reports") == []
    outputs = dvc_outputs()
    assert git("ls-files", "--", *outputs) == [], "DVC outputs committed to git"


def test_git_ignores_every_output_and_benchmark_result():
    """So that DVC writes no reports/.gitignore to commit, and a `git add -A` (which put
    reports/prepare.json back once: 06079ac) adds none of them."""
    made = [*dvc_outputs(), f"{BENCHMARK_RESULTS}/run.json",
            "reports/promote_evaluation.json"]  # written, not declared (dvc.yaml says why)
    ignored = set(git("check-ignore", "--no-index", "--", *made))
    assert [p for p in made if p not in ignored] == []


def test_benchmarks_write_their_results_in_one_folder():
    assert 'RESULTS = ROOT / "reports" / "benchmarks"\n' in \
        (ROOT / "benchmarks" / "common.py").read_text()
    elsewhere = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py"))
                 if p.name != "common.py" and re.search(r'ROOT\s*/\s*"reports"', p.read_text())]
    assert elsewhere == [], "write under common.RESULTS (reports/benchmarks/, git-ignored)"
