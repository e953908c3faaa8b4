"""Peak memory of `quantize` and `export` at 1x and 4x the test split (issue 27 item 10).

Both stages run every format over the whole test split. This benchmark takes a
finished pipeline (a workdir where `dvc repro` ran through `quantize`, e.g. the
photo benchmark's), copies it once per scale with the test split's TFRecords
repeated (1x, 4x; the manifest's count follows), and runs `tfmlops quantize`
then `tfmlops export` there as a user would, sampling the whole process tree's
RSS (psutil, every 50 ms; the reload check's fresh process counts too).
Prints each stage's peak at each scale, the 4x-1x growth and what the split's
float inputs take, and writes reports/benchmarks/eval_memory.json.

    .venv/bin/python benchmarks/eval_memory.py /tmp/run4k
    # the code before the change, side by side in the same run
    .venv/bin/python benchmarks/eval_memory.py /tmp/run4k --baseline-src /tmp/base/src

The copies keep the workdir's params but cut the latency runs (timing is not
measured here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import save, tree_rss  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("quantize", "export")
COPIED = ("params.yaml", "dvc.yaml", "mlflow.db", "mlartifacts", "models", "data/prepared")


def scaled_copy(workdir: Path, scale: int, into: Path) -> Path:
    """The workdir's outputs with the test split's shards repeated `scale` times."""
    for name in COPIED:
        src, dst = workdir / name, into / name
        if src.is_dir():
            shutil.copytree(src, dst)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    prepared = into / "data" / "prepared"
    for path in sorted(prepared.glob("test-*.tfrecord")):
        for k in range(1, scale):
            shutil.copy2(path, path.with_name(f"{path.stem}-copy{k}.tfrecord"))
    manifest = json.loads((prepared / "manifest.json").read_text())
    manifest["split_counts"]["test"] *= scale
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    params = yaml.safe_load((into / "params.yaml").read_text())
    params.setdefault("quantize", {})["latency_runs"] = 5
    params["quantize"]["latency_warmup"] = 1
    params.setdefault("export", {})["latency_runs"] = 5
    params.setdefault("profiling", {})["enabled"] = False
    (into / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return into


def peak_rss(cmd: list[str], cwd: Path, env: dict) -> tuple[int, float, int]:
    """(peak RSS of the process tree, seconds, exit code) of one command."""
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    handle, peak, done = psutil.Process(proc.pid), [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], tree_rss(handle))
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        print(f"{' '.join(cmd[-1:])} failed in {cwd}: {err.strip().splitlines()[-1:]}")
    return peak[0], time.perf_counter() - started, proc.returncode


def measure(workdir: Path, src: Path, scales: list[int], stages=STAGES) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "-1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = {}
    for scale in scales:
        with tempfile.TemporaryDirectory(prefix=f"tfmlops-evalmem-{scale}x-") as tmp:
            copy = scaled_copy(workdir, scale, Path(tmp))
            manifest = json.loads((copy / "data/prepared/manifest.json").read_text())
            n, size, ch = (manifest["split_counts"]["test"], manifest["image_size"],
                           manifest["channels"])
            row = {"test_images": n, "test_float_mb": round(n * size * size * ch * 4 / 2**20, 1)}
            for stage in stages:
                peak, seconds, rc = peak_rss([sys.executable, "-m", "tfmlops", stage], copy, env)
                row[stage] = {"peak_mb": round(peak / 2**20, 1), "seconds": round(seconds, 1),
                              "exit": rc}
                print(f"{src}: {scale}x ({n} test images, {row['test_float_mb']} MB of floats): "
                      f"{stage} peak {row[stage]['peak_mb']} MB, {seconds:.0f} s, exit {rc}",
                      flush=True)
            out[f"{scale}x"] = row
    first, last = f"{scales[0]}x", f"{scales[-1]}x"
    out["growth_mb"] = {s: round(out[last][s]["peak_mb"] - out[first][s]["peak_mb"], 1)
                        for s in stages}
    out["split_growth_mb"] = round(out[last]["test_float_mb"] - out[first]["test_float_mb"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, help="a finished pipeline (through quantize)")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--baseline-src", type=Path, help="src/ of the code to compare with")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                        help="export needs quantize's outputs, which the workdir holds")
    args = parser.parse_args()
    result = {"streamed": measure(args.workdir.resolve(), REPO / "src", args.scales, args.stages)}
    if args.baseline_src:
        result["baseline"] = measure(args.workdir.resolve(), args.baseline_src.resolve(),
                                     args.scales, args.stages)
    for name, r in result.items():
        print(f"{name}: growth {args.scales[0]}x -> {args.scales[-1]}x: " + ", ".join(
            f"{s} {r['growth_mb'][s]} MB" for s in args.stages) +
            f" (the split's floats grow {r['split_growth_mb']} MB)")
    print(f"-> {save('eval_memory', result)}")


if __name__ == "__main__":
    main()
