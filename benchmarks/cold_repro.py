"""Cold `dvc repro` of the default pipeline at two git revisions, alternated on one
machine (issue 26: the code after a change should not be slower than before it).

    .venv/bin/python benchmarks/cold_repro.py --before af40521 [--after HEAD] [--rounds 2]
        [--first after] [--set tune.enabled=false ...] [--target train]

Each run clones the project at one revision into a fresh temp folder and runs
`dvc repro` there: no DVC cache, prepare cache, tuner state, mlflow.db or mlruns
carried over (the clone starts with none of them; the default params need no Keras
ImageNet weights: model.backbone is none). The shared venv's tools run, but the
package comes from the clone's src (PYTHONPATH, checked before every run). Stage wall
times come from dvc's "Running stage 'x'" lines, time-stamped as they stream: a stage
runs until the next one starts (its output hashing and caching included). The 1-minute
load average at each run's start is printed beside it: the machine is shared.

`--set KEY=VALUE` (repeatable) edits params.yaml in both clones before the run, e.g.
`--set tune.enabled=false` trains the params' own model at both revisions: revisions
whose data order differs search differently, and then train, prune and quantize work
on different models (see BENCHMARKS.md).

Prints a table after every round (median and min-max per stage and in total, the
after/before ratio of the medians) and writes reports/benchmarks/cold_repro.json and
each run's log beside it (git-ignored).
"""

from __future__ import annotations

import argparse
import json
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
from common import RESULTS, ROOT, machine  # noqa: E402

BIN = Path(sys.executable).parent
STAGE_LINE = re.compile(r"Running stage '([^']+)'")
OUT = RESULTS / "cold_repro.json"
LOGS = RESULTS / "cold_repro"
# A clone that has any of these is not cold (all git-ignored, so a clone has none).
RUN_STATE = ("data/builtin", "data/prepared", "data/prepare_cache", "data/tuner", "models/train",
             "mlflow.db", "mlruns", "mlartifacts", ".dvc/cache")


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def console_script(copy: Path) -> Path:
    """A `tfmlops` command for the clone, ahead of the venv's on PATH: the venv's script
    calls the entry point of the checkout it was installed from (`tfmlops.cli:entry`
    today), which an older revision may not have; this one calls the clone's own
    (its pyproject's [project.scripts])."""
    import tomllib

    target = tomllib.loads((copy / "pyproject.toml").read_text())["project"]["scripts"]["tfmlops"]
    module, func = target.split(":")
    script = copy.parent / "bin" / "tfmlops"
    script.parent.mkdir(exist_ok=True)
    # The __main__ guard as pip's own scripts have it: prepare's spawned decode workers
    # re-import the main script by path, and without the guard each ran the command again
    # (on photos: workers stuck on the tracking lock, prepare waiting on them forever).
    script.write_text(f"#!{BIN / 'python'}\nimport sys\nsys.path[0] = {str(BIN)!r}\n"
                      f"from {module} import {func}\n"
                      f"if __name__ == '__main__':\n    sys.exit({func}())\n")
    script.chmod(0o755)
    return script.parent


def run_env(copy: Path) -> dict:
    env = {**os.environ,
           "PATH": f"{console_script(copy)}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(copy / "src"), "DVC_NO_ANALYTICS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           # Piped stdout is block-buffered: dvc's stage lines would arrive late, in bursts,
           # and the stage times would be wrong.
           "PYTHONUNBUFFERED": "1"}
    # Either would point the stages at another project's store or root.
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "DVC_ROOT"):
        env.pop(name, None)
    return env


def imported_from(copy: Path, env: dict) -> Path:
    """Where the `tfmlops` console script imports the package from in the clone: the
    script's sys.path[0] is the venv's bin, and the venv's editable install (a .pth to
    /work/main/src) would win if PYTHONPATH did not come first."""
    code = f"import sys; sys.path[0] = {str(BIN)!r}; import tfmlops; print(tfmlops.__file__)"
    out = subprocess.run([str(BIN / "python"), "-c", code], cwd=copy, env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out).resolve()


def fresh_copy(sha: str, parent: Path) -> Path:
    copy = parent / "project"
    git("clone", "-q", "--no-checkout", str(ROOT), str(copy), cwd=parent)
    # On a branch named main, as a user's checkout: promote moves @production only from there.
    git("checkout", "-q", "-B", "main", sha, cwd=copy)
    left = [name for name in RUN_STATE if (copy / name).exists()]
    if left:
        raise SystemExit(f"the clone at {sha[:7]} is not cold: it has {', '.join(left)}")
    return copy


def set_params(copy: Path, overrides: list[str]) -> None:
    """Apply KEY=VALUE overrides (dotted keys, YAML values) to the clone's params.yaml."""
    import yaml

    path = copy / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for item in overrides:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise SystemExit(f"--set {item}: params.yaml at this revision has no {key}")
        node[leaf] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def cold_clone(sha: str, parent: Path, overrides: list[str]) -> tuple[Path, dict, Path]:
    """A fresh clone of `sha` in `parent` with `overrides` set, the environment that runs
    its own code, and where that environment imports tfmlops from (checked: the clone)."""
    copy = fresh_copy(sha, parent)
    if overrides:
        set_params(copy, overrides)
        # Committed, as a user's settings are: promote holds uncommitted work back.
        git("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qam",
            "benchmark settings", cwd=copy)
    env = run_env(copy)
    package = imported_from(copy, env)
    if not package.is_relative_to(copy / "src"):
        raise SystemExit(f"tfmlops is imported from {package}, not from the clone {copy}")
    return copy, env, package


def cold_repro(sha: str, log_path: Path, show_import: bool, overrides: list[str],
               target: str | None = None) -> dict:
    """One cold `dvc repro` at `sha` in a fresh clone: stage and total wall times."""
    parent = Path(tempfile.mkdtemp(prefix="tfmlops-cold-"))
    try:
        copy, env, package = cold_clone(sha, parent, overrides)
        if show_import:
            print(f"  tfmlops imported from {package}", flush=True)
        load = os.getloadavg()
        starts: list[tuple[str, float]] = []
        tail: list[str] = []
        start = time.perf_counter()
        # Line-buffered: the log can be followed while the run goes on.
        with log_path.open("w", buffering=1) as log:
            proc = subprocess.Popen([str(BIN / "dvc"), "repro", *([target] if target else [])],
                                    cwd=copy, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
            for line in proc.stdout:
                now = time.perf_counter()
                log.write(f"{now - start:9.2f} {line}")
                tail = (tail + [line.rstrip("\n")])[-30:]
                if match := STAGE_LINE.search(line):
                    starts.append((match.group(1), now))
            code = proc.wait()
        end = time.perf_counter()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    # Each stage ends where the next starts, the last one where dvc exits.
    bounds = [t for _, t in starts[1:]] + [end]
    stages = {name: round(stop - t, 1)
              for (name, t), stop in zip(starts, bounds[:len(starts)], strict=True)}
    run = {"sha": sha, "set": overrides, "load_avg": [round(x, 2) for x in load],
           "total_s": round(end - start, 1),
           "startup_s": round((starts[0][1] if starts else end) - start, 1), "stages": stages,
           "returncode": code, "log": str(log_path)}
    if code != 0:
        run["failed_stage"] = starts[-1][0] if starts else None
        run["tail"] = tail
    return run


def spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:7.1f} ({min(values):.0f}-{max(values):.0f})" if len(values) > 1 else f"{med:7.1f}"


def table(runs: list[dict], revs: dict[str, str]) -> str:
    """Median (min-max) per stage and in total for each revision, and after/before."""
    by_rev = {label: [r for r in runs if r["sha"] == sha and r["returncode"] == 0]
              for label, sha in revs.items()}
    names = list(dict.fromkeys(n for r in runs for n in r["stages"]))
    head = f"{'':12}" + "".join(f"{label + ' ' + revs[label][:7]:>22}" for label in revs) + \
        f"{'after/before':>14}"
    lines = [head]
    for name in ["startup", *names, "total"]:
        cells, medians = [], []
        for label in revs:
            values = [r["total_s"] if name == "total" else r["startup_s"] if name == "startup"
                      else r["stages"].get(name) for r in by_rev[label]]
            values = [v for v in values if v is not None]
            cells.append(f"{spread(values) if values else '-':>22}")
            medians.append(statistics.median(values) if values else None)
        ratio = f"{medians[1] / medians[0]:.2f}" if None not in medians and medians[0] else "-"
        lines.append(f"{name:12}" + "".join(cells) + f"{ratio:>14}")
    lines.append("")
    lines.append("runs (order, revision, load average 1/5/15 min at start, total s):")
    label_of = {sha: label for label, sha in revs.items()}
    for i, r in enumerate(runs, 1):
        status = "" if r["returncode"] == 0 else f"  FAILED in {r.get('failed_stage')}"
        lines.append(f"  {i}. {label_of[r['sha']]:6} {r['sha'][:7]}  load "
                     f"{'/'.join(f'{x:.2f}' for x in r['load_avg'])}  {r['total_s']:.1f}{status}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the code before")
    parser.add_argument("--after", default="HEAD", help="git revision of the code after")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first", choices=("before", "after"), default="before",
                        help="the revision run first in odd rounds (a round alone: the "
                             "other order than an earlier one's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params.yaml value for both revisions (dotted key, YAML value)")
    parser.add_argument("--target", help="`dvc repro TARGET`: that stage and the ones it "
                        "depends on (default: the whole pipeline)")
    args = parser.parse_args()
    revs = {"before": git("rev-parse", "--verify", f"{args.before}^{{commit}}", cwd=ROOT),
            "after": git("rev-parse", "--verify", f"{args.after}^{{commit}}", cwd=ROOT)}
    LOGS.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    for round_no in range(1, args.rounds + 1):
        # before/after, then after/before: a load that drifts over the session weighs
        # on both revisions alike.
        order = ["before", "after"] if round_no % 2 else ["after", "before"]
        if args.first == "after":
            order.reverse()
        for label in order:
            sha = revs[label]
            print(f"round {round_no}/{args.rounds}: {label} {sha[:7]} ...", flush=True)
            run = cold_repro(sha, LOGS / f"r{round_no}-{label}-{sha[:7]}.log", not runs,
                             args.set, args.target)
            runs.append(run)
            print(f"  {run['total_s']:.1f} s, load at start {run['load_avg'][0]:.2f}", flush=True)
            OUT.write_text(json.dumps({"benchmark": "cold_repro", "command": command,
                                       "machine": machine(), "revisions": revs, "runs": runs},
                                      indent=2) + "\n")
            if run["returncode"] != 0:
                print(f"dvc repro failed at {label} {sha[:7]} in stage "
                      f"'{run['failed_stage']}' (exit {run['returncode']}); its last 30 lines:")
                print("\n".join(run["tail"]))
                print(table(runs, revs))
                raise SystemExit(1)
        print(f"\nafter round {round_no}:\n{table(runs, revs)}\n", flush=True)
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
