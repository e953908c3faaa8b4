"""Pipeline overhead: a cold `dvc repro` of the project on the default data, then
its no-op `dvc repro` against a no-op `dvc repro` of an empty two-stage pipeline,
measured in the same run (median of N). Target: no-op within 1.5x of the empty one.

Then promote's share (issue 46): `promote` is `always_changed`, so every `dvc repro`
runs it. The reproduced project is copied with only promote's `cmd` replaced by a `cp`
that puts back its output files, which DVC deletes before running the stage (`true` would
fail the repro): same stages, deps, outs, always_changed, DVC's own floor. The copy
reproduced once to settle, both committed, and the two no-op `dvc repro`s alternated
(median of --repeats, at least 5, also with --quick). Target: the project's within 2x of
the floor. Promote's line is printed, and whether it answered from
reports/promote/decided.json: the file untouched by every timed run, and one more no-op
(untimed, PYTHONPROFILEIMPORTTIME=1) imports no mlflow.

    .venv/bin/python benchmarks/dvc_pipeline.py [--repeats 5] [--skip-cold REPO] [--quick]
        [--ref HEAD]

The stages run the copy's own code (PYTHONPATH=<copy>/src, checked), not the venv's
editable install of this checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_repro import imported_from  # noqa: E402
from common import ROOT, save  # noqa: E402

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
       "TF_CPP_MIN_LOG_LEVEL": "2"}
ENV.pop("MLFLOW_TRACKING_URI", None)


def run(*args: str, cwd: Path, **extra_env: str) -> tuple[float, str]:
    """(wall seconds, stdout + stderr); a project copy's commands run its own src."""
    env = {**ENV, "PYTHONPATH": str(cwd / "src")} if (cwd / "src" / "tfmlops").is_dir() else ENV
    env = {**env, **extra_env}
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc.stdout + proc.stderr


def sh(*args: str, cwd: Path) -> float:
    return run(*args, cwd=cwd)[0]


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
                "promote": {"gate": {"min_accuracy": 0.5, "max_ece": 1.0}}}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


COPIED = ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore",
          "data/reference_profile.json",  # a dependency of prepare
          "src", ".dvc")


def project_copy(dest: Path, params: dict | None = None, ref: str | None = None) -> Path:
    """The project as a user has it: code, dvc.yaml, params.yaml (with `params`
    merged in), committed; from this checkout's working tree, or from commit `ref`
    (`git archive`: someone's uncommitted edits here stay out)."""
    git_repo(dest)
    if ref:
        names = [n for n in COPIED if subprocess.run(
            ["git", "cat-file", "-e", f"{ref}:{n}"], cwd=ROOT, capture_output=True).returncode == 0]
        archive = subprocess.run(["git", "archive", "--format=tar", ref, "--", *names], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    else:
        for name in COPIED[:5]:
            if (ROOT / name).exists():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
        shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / ".dvc", dest / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    if params:
        import yaml

        merged = merge(yaml.safe_load((dest / "params.yaml").read_text()), params)
        (dest / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
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


def commit_all(repo: Path) -> None:
    sh("git", "add", "-A", cwd=repo)
    if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=repo).returncode:
        sh("git", "commit", "-qm", "bench: reproduced", cwd=repo)


def floor_copy(repo: Path, dest: Path) -> Path:
    """`repo` after its repro, with only promote's cmd replaced, settled and committed:
    DVC's own no-op floor for the same stages, deps, outs and always_changed.
    DVC deletes a stage's outputs before it runs it, so `true` would leave promote's
    report and metrics (reports/promote.json, reports/metrics/promote.json) missing and
    fail the repro: the cmd is a `cp` that puts back a copy of the project's files
    instead (one small exec)."""
    import yaml

    from tfmlops.artifacts import HEADLINES

    shutil.copytree(repo, dest, symlinks=True)
    reports = yaml.safe_load((dest / "params.yaml").read_text())["paths"]["reports"]
    for name in ("promote.json", f"{HEADLINES}/promote.json"):
        (dest / "promote_floor" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(dest / reports / name, dest / "promote_floor" / name)
    path = dest / "dvc.yaml"
    text = path.read_text()
    stage = "  promote:\n    cmd: tfmlops promote\n"
    if text.count(stage) != 1:
        raise SystemExit(f"{path}: no single `promote` stage whose cmd is `tfmlops promote`")
    path.write_text(text.replace(stage, f"  promote:\n    cmd: cp -R promote_floor/. "
                                        f"{reports}/\n"))
    sh(str(BIN / "dvc"), "repro", cwd=dest)  # promote's cmd changed: it runs once
    commit_all(dest)
    return dest


def promote_line(output: str) -> str:
    """promote's log line in a `dvc repro`'s output (its stderr), or ''."""
    lines = [line for line in output.splitlines() if line.startswith("promote: ")]
    return lines[-1] if lines else ""


def promote_vs_floor(repo: Path, work: Path, repeats: int) -> dict:
    """The project's no-op `dvc repro` against the same repo's with promote's cmd a `cp`,
    alternated (the order reversed every round), medians."""
    commit_all(repo)
    floor = floor_copy(repo, work / "floor")
    dvc = str(BIN / "dvc")
    load = os.getloadavg()[0]
    # warm-up: the commit moved HEAD, which a remembered decision records: the first
    # no-op reads the store once and remembers again
    warm = [promote_line(run(dvc, "repro", cwd=repo)[1]) for _ in range(2)]
    sh(dvc, "repro", cwd=floor)
    decided = repo / "reports" / "promote" / "decided.json"
    stamp = decided.stat().st_mtime_ns if decided.exists() else None
    times: dict[str, list[float]] = {"project": [], "floor": []}
    lines: list[str] = []
    for i in range(repeats):
        for which in (("project", "floor") if i % 2 == 0 else ("floor", "project")):
            seconds, output = run(dvc, "repro", cwd=repo if which == "project" else floor)
            times[which].append(seconds)
            if which == "project":
                lines.append(promote_line(output))
    recalled = stamp is not None and stamp == decided.stat().st_mtime_ns
    imports = run(dvc, "repro", cwd=repo, PYTHONPROFILEIMPORTTIME="1")[1]
    mlflow = bool(re.search(r"\|\s+(mlflow|sqlalchemy)(\.|\s*$)", imports, re.M))
    project, floor_s = statistics.median(times["project"]), statistics.median(times["floor"])
    return {"noop_repro_promote_s": round(project, 3), "noop_repro_floor_s": round(floor_s, 3),
            "promote_floor_ratio": round(project / floor_s, 2), "promote_floor_target": 2.0,
            "promote_floor_met": project / floor_s <= 2.0,
            "promote_floor_runs_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "promote_warmup_lines": warm, "promote_lines": sorted(set(lines)),
            "promote_decided_json_untouched": recalled, "promote_imported_mlflow": mlflow,
            "promote_answered_from_decided": recalled and not mlflow and all(
                "already holds @production" in line or "already decided" in line for line in lines),
            "load_1min_before_after": [round(load, 2), round(os.getloadavg()[0], 2)],
            "floor_repo": str(floor)}


def check_import(repo: Path) -> None:
    package = imported_from(repo, {**ENV, "PYTHONPATH": str(repo / "src")})
    if not package.is_relative_to(repo.resolve() / "src"):
        raise SystemExit(f"tfmlops is imported from {package}, not from the copy {repo}")


def source_state(ref: str | None) -> dict:
    """Where a project copy comes from: a commit, or the working tree (HEAD, and whether
    the copied files differ from it)."""
    head = subprocess.run(["git", "rev-parse", ref or "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    if ref:
        return {"source_commit": head}
    diff = subprocess.run(["git", "diff", "HEAD", "--", *COPIED], cwd=ROOT,
                          capture_output=True).stdout
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--",
                                *COPIED], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return {"source_head": head, "source_dirty": bool(diff or untracked),
            "source_diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None,
            "source_untracked": untracked}


def measure(repeats: int = 5, repo: Path | None = None, quick: bool = False,
            floor_repeats: int = 5, ref: str | None = None) -> tuple[dict, Path]:
    work = Path(tempfile.mkdtemp(prefix="tfmlops-bench-dvc-"))
    result: dict = {"benchmark": "dvc_pipeline", "repeats": repeats, "quick": quick,
                    "floor_repeats": floor_repeats}
    if repo is None:
        result.update(source_state(ref))
        repo = project_copy(work / "project", QUICK_PARAMS if quick else None, ref)
        check_import(repo)
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
    check_import(repo)
    result.update(promote_vs_floor(repo, work, floor_repeats))
    return result, repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5,
                        help="no-op runs per median (the promote-vs-floor row: at least 5)")
    parser.add_argument("--skip-cold", type=Path, help="an already reproduced project copy")
    parser.add_argument("--quick", action="store_true",
                        help="reproduce a small pipeline (no search, few epochs), 1 repeat "
                             "for the empty-pipeline row")
    parser.add_argument("--ref", help="copy the project from this commit (e.g. HEAD), not "
                                          "from the working tree")
    args = parser.parse_args()
    result, _ = measure(1 if args.quick else args.repeats, args.skip_cold, args.quick,
                        max(5, args.repeats), args.ref)
    path = save("dvc_pipeline", result)
    cold = f"cold repro {result['cold_repro_s']} s; " if "cold_repro_s" in result else ""
    print(f"dvc pipeline: {cold}no-op {result['noop_repro_s']} s vs empty two-stage no-op "
          f"{result['empty_two_stage_noop_s']} s = {result['ratio']}x (target <= 1.5x: "
          f"{'met' if result['met'] else 'MISSED'}) -> {path}")
    for line in result["promote_lines"]:
        print(f"  no-op repro's {line}")
    if not result["promote_answered_from_decided"]:
        print("  promote did NOT answer every timed no-op from reports/promote/decided.json")
    print(f"noop repro: project {result['noop_repro_promote_s']} s vs same-shape floor "
          f"{result['noop_repro_floor_s']} s = {result['promote_floor_ratio']} x (target <= 2x: "
          f"{'met' if result['promote_floor_met'] else 'MISSED'})")


if __name__ == "__main__":
    main()
