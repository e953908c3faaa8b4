"""Training on photos at 1x and 4x the images: images/s and peak memory with `cache: auto`.

Issue 12's row 5. A photo-size set (benchmarks/photo_set.py: 400-1200 px
JPEG/PNG) of N and 4N images is prepared at image_size 96, RGB, then
`tfmlops train` runs on each (its own process, tracking off, no tune, a few
epochs, profiling on) while the peak resident memory of its process tree is
sampled. Each budget in --budget-mb is one `pipeline.cache_budget_mb`; the
default pair is the params' own (both sizes fit: memory) and one between the
two sizes' decoded train splits (1x in memory, 4x on disk), so both of auto's
choices are measured. Target: peak RSS at 4x <= 1.5x the peak at 1x; the
profiled steps' input wait < 5%. Writes reports/benchmarks/train_photos.json.

    .venv/bin/python benchmarks/train_photos.py [--images 300] [--epochs 3] [--budget-mb 1024 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT, save, scratch_config  # noqa: E402
from photo_set import make_photo_set  # noqa: E402

IMAGE_SIZE, CHANNELS = 96, 3


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants, from /proc."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines()
                              if line.startswith("VmRSS:"))) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue  # the process ended between two reads
    return total


def run_measured(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Run `cmd`, sampling its process tree's RSS every 50 ms; {seconds, peak_rss_mb}."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("MLFLOW_TRACKING_URI", None)
    peak, started = 0, time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, tree_rss_bytes(proc.pid))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
    if code != 0:
        tail = log.read_text().strip().splitlines()[-5:]
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n" + "\n".join(tail))
    return {"seconds": round(time.perf_counter() - started, 1),
            "peak_rss_mb": round(peak / 2**20, 1)}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tfmlops", *args]


def prepared_scale(workdir: Path, photos: Path, epochs: int, batch: int) -> tuple:
    """A scratch project whose data are `images` photos, prepared; (workdir, prepare figures)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg, workdir = scratch_config(
        workdir,
        data={"image_dir": str(photos), "image_size": IMAGE_SIZE, "channels": CHANNELS},
        tune={"enabled": False},
        train={"epochs": epochs, "batch_size": batch, "use_tuned": False,
               "early_stopping_patience": 0},
        profiling={"enabled": True, "start_step": 5, "steps": 3},
    )
    prep = run_measured(cli("--params", "params.yaml", "prepare"), workdir, workdir / "prepare.log")
    return cfg, workdir, prep


def train_once(cfg, workdir: Path, budget_mb: int) -> dict:
    """`tfmlops train` with cache auto at `budget_mb`; its figures and auto's choice."""
    import yaml

    from tfmlops.config import load_config
    from tfmlops.data import pipeline

    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["pipeline"].update(cache="auto", cache_budget_mb=budget_mb)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cfg = load_config(workdir / "params.yaml")
    choice = pipeline.cache_choice(cfg, pipeline.load_prepared(cfg))
    measured = run_measured(cli("--params", "params.yaml", "train"), workdir,
                            workdir / f"train-{budget_mb}.log")
    report = json.loads((Path(cfg.paths.reports) / "train.json").read_text())
    return {"budget_mb": budget_mb, "cache": choice["mode"],
            "train_split_decoded_mb": choice["estimate_mb"],
            "train_images": pipeline.load_prepared(cfg).counts["train"],
            "images_per_s": report["images_per_s"],
            "input_wait_share": report.get("profile_input_wait_share"),
            "peak_rss_mb": measured["peak_rss_mb"], "train_seconds": measured["seconds"]}


def photo_sets(scratch: Path, images: int, factor: int) -> dict:
    """{1: set, factor: set}: the factor-x set, and the 1x set as hard links to its first
    images (image i depends only on the seed and i); kept for a rerun with --scratch."""
    big = scratch / f"photos_{factor}x"
    files = [p for p in big.rglob("*") if p.suffix in (".jpg", ".png")]
    if len(files) != images * factor:
        make_photo_set(big, images * factor, classes=8)
        files = [p for p in big.rglob("*") if p.suffix in (".jpg", ".png")]
    small = scratch / "photos_1x"
    for p in files:
        if int(p.stem.split("_")[1]) < images and not (small / p.relative_to(big)).exists():
            (small / p.relative_to(big)).parent.mkdir(parents=True, exist_ok=True)
            os.link(p, small / p.relative_to(big))
    return {scale: {"dir": str(folder), "images": sum(1 for p in folder.rglob("*")
                                                      if p.suffix in (".jpg", ".png"))}
            for scale, folder in ((1, small), (factor, big))}


def measure(images: int, factor: int, epochs: int, batch: int, budgets: list[int],
            scratch: Path) -> dict:
    sets = photo_sets(scratch, images, factor)
    rows = []
    for scale in (1, factor):
        cfg, workdir, prep = prepared_scale(scratch / f"project_{scale}x",
                                            Path(sets[scale]["dir"]), epochs, batch)
        for budget in budgets:
            row = {"scale": f"{scale}x", "images": sets[scale]["images"], **train_once(
                cfg, workdir, budget)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        rows[-1]["prepare_seconds"] = prep["seconds"]
    ratios = {}
    for budget in budgets:
        one, big = (next(r for r in rows if r["scale"] == s and r["budget_mb"] == budget)
                    for s in ("1x", f"{factor}x"))
        ratios[str(budget)] = round(big["peak_rss_mb"] / one["peak_rss_mb"], 3)
    waits = [r["input_wait_share"] for r in rows if r["input_wait_share"] is not None]
    return {
        "benchmark": "train_photos", "image_size": IMAGE_SIZE, "channels": CHANNELS,
        "epochs": epochs, "batch_size": batch, "rows": rows, "peak_rss_ratio_by_budget": ratios,
        "target_peak_rss_ratio": 1.5, "met_memory": all(v <= 1.5 for v in ratios.values()),
        "target_input_wait_share": 0.05, "met_input_wait": bool(waits) and max(waits) < 0.05,
        "scratch": str(scratch),
    }


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="images at 1x")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--budget-mb", type=int, nargs="+", default=None,
                        help="pipeline.cache_budget_mb values (default: the params' and one "
                             "between the 1x and 4x train splits' decoded size)")
    parser.add_argument("--scratch", type=Path, default=None)
    args = parser.parse_args()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="tfmlops-train-photos-"))
    budgets = args.budget_mb or [default_budget(), middle_budget(args.images, args.factor)]
    result = measure(args.images, args.factor, args.epochs, args.batch_size, budgets,
                     scratch)
    path = save("train_photos", result)
    print(f"\ntrain on photos ({IMAGE_SIZE}px RGB, {args.epochs} epochs, cache: auto):")
    print(f"{'scale':>6} {'images':>7} {'budget MB':>10} {'cache':>7} {'img/s':>8} "
          f"{'input wait':>11} {'peak RSS MB':>12}")
    for r in result["rows"]:
        wait = "n/a" if r["input_wait_share"] is None else f"{100 * r['input_wait_share']:.1f}%"
        print(f"{r['scale']:>6} {r['images']:>7} {r['budget_mb']:>10} {r['cache']:>7} "
              f"{r['images_per_s']:>8.1f} {wait:>11} {r['peak_rss_mb']:>12.0f}")
    for budget, ratio in result["peak_rss_ratio_by_budget"].items():
        print(f"peak RSS {args.factor}x / 1x at budget {budget} MB: {ratio}x "
              f"(target <= 1.5x: {'met' if ratio <= 1.5 else 'MISSED'})")
    print(f"-> {path}")


def default_budget() -> int:
    import yaml

    return int(yaml.safe_load((ROOT / "params.yaml").read_text())["pipeline"]["cache_budget_mb"])


def middle_budget(images: int, factor: int) -> int:
    # Halfway (geometrically) between the 1x and 4x train splits' decoded float32 size,
    # taking ~70% of the images for train: auto keeps 1x in memory and puts 4x on disk.
    one = 0.7 * images * IMAGE_SIZE ** 2 * CHANNELS * 4 / 2**20
    return max(1, round(one * factor ** 0.5))


if __name__ == "__main__":
    main()
