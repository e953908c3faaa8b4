"""Seed-to-seed retrains of the default final model against promote's non-inferiority
gate (issue 46): a retrain that differs from the model in production only in its training
seed, compared on the same test images, is the candidate the gate sees most often.

    .venv/bin/python benchmarks/retrain_discordance.py [--seeds 5] [--ref HEAD]
        [--workdir DIR] [--control]

In a git clone of the project at --ref (in a temp folder, or --workdir DIR: a clone made
there by an earlier run is reused), with only params.yaml's `tracking.enabled` set to
false: `dvc repro train` with the default params (materialize, prepare, tune, train with
seed 42) keeps train's model.keras as the reference. Then `tfmlops train` alone again with
seeds 1..K, on the same prepared data and tune output: tune records the top-level seed
(it also makes prepare's split and drives the search), so train would refuse the other
seed as stale; here tune's staleness check (model.hparams.check_fresh) is told the
searched seed 42, every other key is still checked. --control also retrains seed 42 that
way (its weights should equal the reference's).

Each model.keras predicts the test split (load_prepared, StoredSplit, load_keras3); vs
seed 42 on the same n images: b = only the retrain right, c = only seed 42 right,
difference (b - c) / n, evaluation.paired_interval's low/high and evaluation.monotone_low
at promote.gate.confidence, and the verdict of the gate's max_regression check with the
clone's promote.gate params: refused if difference < -max_regression, passed if
monotone_low >= -max_regression, else inconclusive (also below min_images). Only that
check: the gate's other checks (accuracy floor, recalls, ECE, edge file, size, latency)
and promote's own evaluation of the exported models are not run here.

The stages and the evaluation run the clone's code (PYTHONPATH, checked), not the venv's
editable install of this checkout. Prints a table; writes
reports/benchmarks/retrain_discordance.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, save  # noqa: E402

BIN = Path(sys.executable).parent
REFERENCE_SEED = 42
TRAIN_WORKER = "--train-worker"  # internal: one `tfmlops train` with the searched seed told


def run_env(clone: Path) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(clone / "src"), "DVC_NO_ANALYTICS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "DVC_ROOT"):
        env.pop(name, None)
    return env


def sh(*args: str, cwd: Path, log: Path) -> float:
    """Run, output to `log`; wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(args, cwd=cwd, env=run_env(cwd), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {cwd}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start


def train_worker(params_file: str, searched_seed: int) -> int:
    """`tfmlops --params <file> train`, tune's staleness check told the searched seed."""
    from tfmlops import cli
    from tfmlops.config import config_from_dict
    from tfmlops.model import hparams

    original = hparams.check_fresh

    def check_fresh_except_seed(cfg, data_version):
        tree = cfg.to_dict()
        tree["seed"] = searched_seed
        return original(config_from_dict(tree), data_version)

    hparams.check_fresh = check_fresh_except_seed
    return cli.main(["--params", params_file, "train"])


def clone_at(ref: str, workdir: Path) -> tuple[Path, str]:
    """A clone of this checkout's commit `ref` in workdir/project (reused if there), with
    tracking.enabled: false; (its path, its commit)."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.strip()
    clone = workdir / "project"
    if not (clone / ".git").exists():
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
    have = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, check=True,
                          capture_output=True, text=True).stdout.strip()
    if have != sha:
        raise SystemExit(f"{clone} is at {have[:10]}, not {ref} ({sha[:10]})")
    params = clone / "params.yaml"
    text = params.read_text()
    # only tracking's own `enabled`, comments and everything else left as they are
    section = r"(?m)^(tracking:\n(?:[ \t]*#.*\n|  \S.*\n)*?  enabled: )"
    edited, count = re.subn(section + r"true\b", r"\1false", text)
    if count:
        params.write_text(edited)
    elif not re.search(section + r"false\b", text):
        raise SystemExit(f"{params}: no `tracking.enabled` to turn off")
    return clone, sha


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def keep(clone: Path, train_dir: str, name: str) -> Path:
    """models/train as it is now -> saved/<name>/ (with reports/train.json)."""
    dest = clone / "saved" / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(clone / train_dir, dest)
    shutil.copy2(clone / "reports" / "train.json", dest / "train_report.json")
    return dest


def retrain(clone: Path, seed: int, train_dir: str) -> tuple[Path, float]:
    text = (clone / "params.yaml").read_text()
    seeded, count = re.subn(rf"(?m)^seed: {REFERENCE_SEED}\b", f"seed: {seed}", text)
    if count != 1:
        raise SystemExit(f"params.yaml: no single top-level `seed: {REFERENCE_SEED}`")
    params = clone / f"params_seed{seed}.yaml"
    params.write_text(seeded)
    seconds = sh(str(BIN / "python"), str(Path(__file__).resolve()), TRAIN_WORKER, params.name,
                 str(REFERENCE_SEED), cwd=clone, log=clone / "logs" / f"train_seed{seed}.log")
    return keep(clone, train_dir, f"seed{seed}_retrain" if seed == REFERENCE_SEED
                else f"seed{seed}"), seconds


def verdict(b: int, c: int, n: int, gate) -> tuple[str, float]:
    """The max_regression check's outcome on these counts, and the monotone lower bound."""
    from tfmlops.evaluation import monotone_low

    low = monotone_low(b, c, n, gate.confidence)
    if (b - c) / n < -gate.max_regression:
        return "refused", low
    if n < gate.min_images:
        return "inconclusive", low
    return ("passed" if low >= -gate.max_regression else "inconclusive"), low


def evaluate(clone: Path, models: dict[str, tuple[int, Path]]) -> dict:
    """Every model on the clone's test split, each vs the reference (seed 42)."""
    sys.path.insert(0, str(clone / "src"))
    os.chdir(clone)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    import tfmlops
    from tfmlops import gate as gate_module
    from tfmlops.config import load_config
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.data.stored_split import StoredSplit
    from tfmlops.evaluation import paired_interval
    from tfmlops.model.trained import load_keras3

    if not Path(tfmlops.__file__).resolve().is_relative_to(clone.resolve() / "src"):
        raise SystemExit(f"tfmlops is imported from {tfmlops.__file__}, not from {clone}")
    cfg = load_config("params.yaml")
    gate = cfg.promote.gate
    prepared = load_prepared(cfg)
    hashes, xs, ys = [], [], []
    for h, _, x, y in StoredSplit.of(prepared).hashed_batches():
        hashes += h
        xs.append(x)
        ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    n = len(y)

    def predict(path: Path):
        model = load_keras3(path / "model.keras")
        correct = np.argmax(model.predict(x, batch_size=256, verbose=0), axis=1) == y
        return model, correct

    ref_model, ref = predict(models["seed42"][1])
    rows = []
    for name, (seed, path) in models.items():
        if name == "seed42":
            continue
        model, mine = predict(path)
        pair = paired_interval(mine, ref, gate.confidence)
        b, c = pair["candidate_only"], pair["production_only"]
        outcome, low = verdict(b, c, n, gate)
        row = {"seed": seed, "name": name, "n": n, "accuracy": float(mine.mean()),
               "correct": int(mine.sum()), "b": b, "c": c, "difference": (b - c) / n,
               "low": pair["low"], "high": pair["high"], "monotone_low": low, "verdict": outcome,
               "model_sha256": sha256(path / "model.keras"),
               "only_retrain_right": [hashes[i] for i in np.flatnonzero(mine & ~ref)],
               "only_seed42_right": [hashes[i] for i in np.flatnonzero(~mine & ref)]}
        paired = getattr(gate_module, "_paired", None)  # the gate's own check, to agree with
        if paired is not None:
            check = paired(gate, type("Production", (), {"version": "42"})(), pair)
            row["gate_check"] = "passed" if check.passed else \
                "inconclusive" if check.inconclusive else "refused"
            if n >= gate.min_images and row["gate_check"] != outcome:
                raise SystemExit(f"seed {seed}: the gate's check says {row['gate_check']}, "
                                 f"this script {outcome}")
        if seed == REFERENCE_SEED:
            wa, wb = ref_model.get_weights(), model.get_weights()
            row["weights_identical_to_reference"] = bool(
                len(wa) == len(wb) and all(np.array_equal(p, q) for p, q in zip(wa, wb, strict=True)))
        rows.append(row)
    return {"n": n, "label_counts": np.bincount(y).tolist(),
            "prepared_manifest_sha256": sha256(Path(cfg.paths.prepared) / "manifest.json"),
            "gate": {"max_regression": gate.max_regression, "confidence": gate.confidence,
                     "min_images": gate.min_images},
            "reference": {"seed": REFERENCE_SEED, "n": n, "accuracy": float(ref.mean()),
                          "correct": int(ref.sum()),
                          "model_sha256": sha256(models["seed42"][1] / "model.keras")},
            "retrains": rows}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == TRAIN_WORKER:
        sys.exit(train_worker(sys.argv[2], int(sys.argv[3])))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="retrain with seeds 1..K")
    parser.add_argument("--ref", default="HEAD", help="the commit of this checkout to clone")
    parser.add_argument("--workdir", type=Path, help="where the clone goes (default: a temp folder)")
    parser.add_argument("--control", action="store_true",
                        help="also retrain seed 42 the retrains' way (a determinism check)")
    args = parser.parse_args()
    import yaml

    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="tfmlops-retrain-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    clone, sha = clone_at(args.ref, workdir)
    params = yaml.safe_load((clone / "params.yaml").read_text())
    if params["seed"] != REFERENCE_SEED or params["tracking"]["enabled"]:
        raise SystemExit(f"{clone}/params.yaml: expected seed {REFERENCE_SEED}, tracking off")
    train_dir = params["paths"]["train"]
    print(f"clone of {sha[:10]} in {clone}; dvc repro train ...", flush=True)
    repro_s = sh(str(BIN / "dvc"), "repro", "train", cwd=clone, log=clone / "logs" / "repro_train.log")
    models = {"seed42": (REFERENCE_SEED, keep(clone, train_dir, "seed42"))}
    train_s = {}
    for seed in [*range(1, args.seeds + 1), *([REFERENCE_SEED] if args.control else [])]:
        path, train_s[seed] = retrain(clone, seed, train_dir)
        models[path.name] = (seed, path)
        print(f"  seed {seed}: trained in {train_s[seed]:.0f} s", flush=True)
    result = {"benchmark": "retrain_discordance", "commit": sha, "clone": str(clone),
              "seeds": args.seeds, "repro_train_s": round(repro_s, 1),
              "train_s": {str(k): round(v, 1) for k, v in train_s.items()},
              **evaluate(clone, models)}
    path = save("retrain_discordance", result)
    g, ref = result["gate"], result["reference"]
    print(f"seed 42 (tune's seed too): n={ref['n']} accuracy {ref['accuracy']:.4f} "
          f"({ref['correct']}/{ref['n']}); gate max_regression {g['max_regression']:g}, "
          f"confidence {g['confidence']:g}")
    print(f"{'seed':>4} {'n':>4} {'accuracy':>8} {'b':>2} {'c':>2} {'difference':>10} "
          f"{'interval':>18} {'mono low':>8}  verdict")
    for r in result["retrains"]:
        tag = " (control)" if r["seed"] == REFERENCE_SEED else ""
        print(f"{r['seed']:>4} {r['n']:>4} {r['accuracy']:>8.4f} {r['b']:>2} {r['c']:>2} "
              f"{r['difference']:>+10.4f} [{r['low']:+.4f}, {r['high']:+.4f}] "
              f"{r['monotone_low']:>+8.4f}  {r['verdict']}{tag}")
    counts = {v: sum(r["verdict"] == v for r in result["retrains"] if r["seed"] != REFERENCE_SEED)
              for v in ("passed", "inconclusive", "refused")}
    print(f"retrains vs seed 42: {counts['passed']} passed, {counts['inconclusive']} inconclusive, "
          f"{counts['refused']} refused -> {path}")


if __name__ == "__main__":
    main()
