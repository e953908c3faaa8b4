"""Whether two revisions train the same model: a move that changes no behaviour shows
it here (issue 49). Each revision's `src/` is checked out into a folder of its own and
runs `materialize`, `prepare` and `train` on digits for a few epochs (tune off,
profiling off, tracking in the folder's own SQLite store); then the trained weights,
the history and the reports are compared, timings left out.

    python benchmarks/same_model.py --before b1d8e1f --after HEAD [--epochs 3] [--work DIR]

Prints one line per compared thing and exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml
from common import ROOT

STAGES = ("materialize", "prepare", "train")
# keys holding wall-clock figures, which differ from run to run
TIMING = ("seconds", "time", "duration", "_s", "per_epoch", "throughput", "images_per")
REPORTS = ("reports/train.json", "reports/prepare.json", "models/train/classification_report.json",
           "models/train/precision.json", "models/train/tune_merge.json")


def check_out(rev: str, folder: Path, epochs: int) -> None:
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "src", "params.yaml"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    params = yaml.safe_load((folder / "params.yaml").read_text())
    params["train"].update(epochs=epochs, use_tuned=False)
    params["profiling"]["enabled"] = False
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def train(folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(folder / "src"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db"}
    for stage in STAGES:
        subprocess.run([sys.executable, "-m", "tfmlops", "-q", stage], cwd=folder, env=env,
                       check=True, stdout=subprocess.DEVNULL)


def weights(folder: Path) -> dict:
    import h5py

    with zipfile.ZipFile(folder / "models/train/model.keras") as z:
        f = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
    found: dict = {}
    f.visititems(lambda name, o: found.__setitem__(name, o[()]) if isinstance(o, h5py.Dataset)
                 else None)
    return found


def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def compare(a: Path, b: Path) -> list[tuple[str, bool]]:
    import numpy as np

    wa, wb = weights(a), weights(b)
    same = wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
    rows = [(f"weights ({len(wa)} arrays)", same)]
    history = [untimed(list(csv.DictReader(open(f / "reports/train_history.csv")))) for f in (a, b)]
    rows.append((f"history ({len(history[0])} epochs)", history[0] == history[1]))
    for name in REPORTS:
        rows.append((name, untimed(json.loads((a / name).read_text()))
                     == untimed(json.loads((b / name).read_text()))))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--work", type=Path, help="where the two folders go (default: a temp folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tfmlops-same-model-"))
    folders = []
    for rev in (args.before, args.after):
        folder = work / rev.replace("/", "_")
        check_out(rev, folder, args.epochs)
        train(folder)
        folders.append(folder)
    rows = compare(*folders)
    for what, same in rows:
        print(f"{what:45} {'identical' if same else 'DIFFERS'}")
    return 0 if all(same for _, same in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
