"""Planted label flips on digits: how many train's label-issue list finds (issue 51).

Per seed, in a scratch folder: materialize the digits, move a seeded share of the images
(default 2%; only images whose bytes occur once in the set) each to another class folder
drawn at random, then `prepare` and `train` (tune off: params.yaml's model, epochs and
`train.label_issues`; tracking off). From prepare's manifest and train's
reports/label_issues.csv and train.json: the planted flips that landed in val or test,
how many images were flagged and listed, recall (the share of those flips listed),
precision (the share of the listed images that were planted) and how many listed images
the model predicts as their given label.

Side by side, on the held-out probabilities of the same trained model (reloaded): the
list this replaced (the `train.label_issues` lowest p(given label), flagged or not) and,
when cleanlab is installed (the test extra), cleanlab's default `find_label_issues`
(prune_by_noise_rate), both ranked by p(given) and cut at the same count.

    .venv/bin/python benchmarks/label_flips.py [--seeds 1 2 3] [--share 0.02] [--quick]

--quick: 16 px, a small model, 8 epochs (a check that it runs). Writes
reports/benchmarks/label_flips.json.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import save, scratch_config  # noqa: E402

HELD_OUT = ("val", "test")
QUICK = {"data": {"image_size": 16},
         "model": {"blocks": [{"filters": 16, "kernel_size": 3, "separable": False},
                              {"filters": 32, "kernel_size": 3, "separable": False}],
                   "convs_per_block": 1, "head_units": 64},
         "train": {"epochs": 8}}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plant_flips(images: Path, share: float, seed: int) -> list[dict]:
    """Move round(share x all images) of the class folders' images, drawn with `seed`
    among those whose bytes occur once (a flipped copy must not have a correctly filed
    twin), each into another class folder drawn at random. Returns, per moved image, its
    new relative path, sha256, true class and the class it is now filed under."""
    rng = np.random.default_rng(seed)
    paths = sorted(p for p in images.glob("*/*") if p.is_file())
    hashes = {p: sha256(p) for p in paths}
    counts = Counter(hashes.values())
    once = [p for p in paths if counts[hashes[p]] == 1]
    classes = sorted({p.parent.name for p in paths})
    planted = []
    for i in sorted(rng.choice(len(once), round(share * len(paths)), replace=False)):
        path = once[i]
        given = str(rng.choice([c for c in classes if c != path.parent.name]))
        moved = images / given / path.name
        assert not moved.exists(), moved  # builtin names are unique across classes
        path.rename(moved)
        planted.append({"file": str(moved.relative_to(images)), "sha256": hashes[path],
                        "true": path.parent.name, "given": given})
    return planted


def planted_held_out(planted: list[dict], manifest: dict) -> set[tuple[str, str]]:
    """(sha256, given class) of the planted flips prepare put in val or test."""
    split = {f["file"]: f["split"] for f in manifest["files"]}
    return {(p["sha256"], p["given"]) for p in planted if split[p["file"]] in HELD_OUT}


def score(held: set[tuple[str, str]], listed: list[tuple[str, str]]) -> dict:
    """Recall (the share of `held` listed) and precision (the share of `listed` in
    `held`); None where there is nothing to divide by."""
    hits = len(held & set(listed))
    return {"listed": len(listed), "listed_planted": hits,
            "recall": round(hits / len(held), 4) if held else None,
            "precision": round(hits / len(listed), 4) if listed else None}


def listed_in_csv(reports: Path) -> tuple[list[tuple[str, str]], int]:
    """((sha256, given class) of train's listed images, how many are predicted as given)."""
    from tfmlops.artifacts import LABEL_ISSUES_CSV

    with open(reports / LABEL_ISSUES_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [(r["sha256"], r["given"]) for r in rows], sum(r["predicted"] == r["given"] for r in rows)


def other_rules(cfg, cap: int) -> dict[str, tuple[list[tuple[str, str]], int]]:
    """(sha256, given class) listed by each rule on the trained model's held-out
    probabilities, lowest p(given) first, at most `cap`; how many are predicted as given."""
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.data.stored_split import stored_records
    from tfmlops.model.trained import MODEL_FILE, load_keras3
    from tfmlops.stages.train import label_issues as li

    prepared = load_prepared(cfg)
    model = load_keras3(Path(cfg.paths.train) / MODEL_FILE)
    held = li.HeldOut.of({s: li.predict(model, prepared, s, 256) for s in HELD_OUT})
    keys = [(sha, prepared.classes[y]) for s in HELD_OUT
            for shas, _, labels in stored_records(prepared.folder, s)
            for sha, y in zip(shas, labels, strict=True)]
    p_given = li.self_confidence(held.probs, held.labels)
    rows = {"this rule, recomputed": li.ranked(held.probs, held.labels, cap)[0],
            "lowest p(given) (the old list)": np.argsort(p_given, kind="stable")[:cap]}
    try:
        from cleanlab.filter import find_label_issues
    except ImportError:
        print("cleanlab is not installed: its default rule is not compared", flush=True)
    else:
        rows["cleanlab default (prune_by_noise_rate)"] = find_label_issues(
            held.labels, held.probs, return_indices_ranked_by="self_confidence", n_jobs=1)[:cap]
    as_given = held.probs.argmax(axis=1) == held.labels
    return {name: ([keys[i] for i in r], int(as_given[r].sum())) for name, r in rows.items()}


def one_seed(seed: int, share: float, quick: bool) -> dict:
    from tfmlops.artifacts import read_manifest
    from tfmlops.stages import materialize, prepare, train

    sections = {**(QUICK if quick else {}), "seed": seed}
    sections["train"] = {**sections.get("train", {}), "use_tuned": False}
    cfg, workdir = scratch_config(**sections)
    materialize.run(cfg)
    planted = plant_flips(Path(cfg.data.image_dir), share, seed)
    prepare.run(cfg)
    metrics = train.run(cfg)
    held = planted_held_out(planted, read_manifest(cfg.paths.prepared))
    rules = {"confident learning (train's list)": listed_in_csv(Path(cfg.paths.reports)),
             **other_rules(cfg, cfg.train.label_issues)}
    return {"seed": seed, "workdir": str(workdir), "planted": len(planted),
            "planted_held_out": len(held), "test_accuracy": round(metrics["test_accuracy"], 4),
            "flagged": metrics["label_issues_flagged"], "cap": cfg.train.label_issues,
            "rules": {name: {**score(held, listed), "predicted_as_given": as_given}
                      for name, (listed, as_given) in rules.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--share", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        run = one_seed(seed, args.share, args.quick)
        runs.append(run)
        print(f"seed {seed}: {run['planted']} flips planted, {run['planted_held_out']} in val/test;"
              f" test accuracy {run['test_accuracy']}; {run['flagged']} flagged", flush=True)
        for name, s in run["rules"].items():
            print(f"  {name}: {s['listed']} listed, {s['listed_planted']} planted, recall "
                  f"{s['recall']}, precision {s['precision']}; {s['predicted_as_given']} "
                  "predicted as given", flush=True)
    path = save("label_flips", {"benchmark": "label_flips", "share": args.share,
                                "quick": args.quick, "runs": runs})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
