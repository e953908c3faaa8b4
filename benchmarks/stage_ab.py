"""One stage, as `dvc repro` runs it (`tfmlops <stage>`, a whole process), under two code
trees alternated on one workspace: wall and CPU seconds, and the stage's own timing keys.

    .venv/bin/python benchmarks/stage_ab.py WORKSPACE STAGE --before SRC --after SRC
        [--rounds 2] [--key convert_seconds]

WORKSPACE is a project whose upstream outputs exist (e.g. a clone after `dvc repro prune`
with small epochs: the stage's cost, not the model's quality, is measured; both trees
work on the same inputs). Each run replaces the stage's output, as a rerun does. CPU is
user + system of the process and the children it waited for (its tracking sidecar): on
a shared machine it moves much less than wall time. Rounds alternate the order. Writes
reports/benchmarks/stage_ab_<stage>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

BIN = Path(sys.executable).parent


def one_run(workspace: Path, stage: str, src: str, keys: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "python"), "-m", "tfmlops", stage], cwd=workspace, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"tfmlops {stage} failed with {src}:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "load": round(os.getloadavg()[0], 1), **{k: result.get(k) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("stage")
    parser.add_argument("--before", required=True, help="the src folder of the code before")
    parser.add_argument("--after", required=True, help="the src folder of the code after")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--key", action="append", default=[],
                        help="a key of the stage's JSON result to report (e.g. convert_seconds)")
    args = parser.parse_args()
    codes = {"before": args.before, "after": args.after}
    runs: list[dict] = []
    for i in range(args.rounds):
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            run = {"round": i + 1, "code": name,
                   **one_run(args.workspace, args.stage, codes[name], args.key)}
            print(json.dumps(run), flush=True)
            runs.append(run)
    medians = {name: {k: statistics.median(r[k] for r in runs if r["code"] == name)
                      for k in ("wall_s", "cpu_s", *args.key)
                      if all(r[k] is not None for r in runs)} for name in codes}
    ratios = {k: round(medians["after"][k] / medians["before"][k], 3)
              for k in medians["before"] if medians["before"][k]}
    print(f"medians: {medians}\nafter/before: {ratios}")
    path = save(f"stage_ab_{args.stage}", {"command": " ".join(sys.argv), "codes": codes,
                                           "runs": runs, "medians": medians, "ratios": ratios})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
