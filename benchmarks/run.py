"""All benchmarks in one run: every figure a ratio measured side by side.

    .venv/bin/python benchmarks/run.py [--skip-cold REPO]

1. input pipeline vs a PIL generator, and the input-wait share of a training step
   (from the cold repro's train profiler trace);
2. training throughput: pipeline vs in-memory tensors;
3. inference: every format vs ONNX Runtime float32 (on the cold repro's exports);
4. pipeline: cold `dvc repro` on the default data; no-op repro vs an empty two-stage one;
5. tracking overhead of the train stage;
6. scaling on the synthetic dataset at 1x/4x/16x.

`prepare` on photo-size images (issue 12 rows 1-4) runs on its own, as it generates
thousands of photos: benchmarks/prepare_photos.py -> reports/benchmarks_prepare.json.

Writes reports/benchmarks.json (all results, the machine, the command) and prints
a summary; BENCHMARKS.md quotes a run of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dvc_pipeline  # noqa: E402
import input_pipeline  # noqa: E402
import training  # noqa: E402
from common import RESULTS, ROOT, machine  # noqa: E402

OUT = ROOT / "reports" / "benchmarks.json"


def inference_in_own_process(repo: Path, runs: int) -> dict:
    """TensorFlow's thread counts are fixed at its start: a fresh process sets them to 1."""
    subprocess.run([sys.executable, str(Path(__file__).with_name("inference.py")),
                    "--repo", str(repo), "--runs", str(runs)], check=True)
    return json.loads((RESULTS / "inference.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", type=Path,
                        help="reuse a project copy already reproduced by an earlier run")
    args = parser.parse_args()
    started = time.perf_counter()
    results: dict = {"command": " ".join(["benchmarks/run.py", *sys.argv[1:]]),
                     "machine": machine()}

    def step(name, fn, *a, **kw):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        out = fn(*a, **kw)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = out
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=2, default=str) + "\n")  # a crash keeps the rest
        return out

    pipeline_result = step("dvc_pipeline", lambda: dvc_pipeline.measure(3, args.skip_cold)[0])
    repo = Path(pipeline_result["repo"])
    train_report = json.loads((repo / "reports" / "train.json").read_text())
    ip = step("input_pipeline", input_pipeline.measure)
    ip["input_wait_share"] = train_report.get("profile_input_wait_share")
    ip["input_wait_target"] = 0.05
    ip["input_wait_met"] = ip["input_wait_share"] is not None and ip["input_wait_share"] < 0.05
    step("training_throughput", training.throughput)
    step("inference", inference_in_own_process, repo, 300)
    step("training_tracking", training.tracking)
    step("training_scaling", training.scaling)
    results["total_seconds"] = round(time.perf_counter() - started, 1)

    OUT.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_summary(results)
    print(f"-> {OUT} ({results['total_seconds']} s)")


def print_summary(r: dict) -> None:
    ok = lambda met: "met" if met else "MISSED"  # noqa: E731
    ip, tt, inf = r["input_pipeline"], r["training_throughput"], r["inference"]
    dp, tr, sc = r["dvc_pipeline"], r["training_tracking"], r["training_scaling"]
    print("\nfigure                                   measured            target      ")
    print(f"input pipeline vs PIL generator          {ip['ratio']:>8}x          >= 20x  {ok(ip['met'])}")
    wait = ip["input_wait_share"]
    print(f"input wait share of a train step         {wait if wait is None else f'{wait:.2%}':>9}"
          f"          < 5%    {ok(ip['input_wait_met'])}")
    print(f"train throughput pipeline/in-memory      {tt['ratio']:>8}x          >= 0.9x {ok(tt['met'])}")
    print(f"served runtime p50 / ONNX Runtime fp32   {inf['served_p50_vs_onnx']:>8}x          <= 1x   "
          f"{ok(inf['met'])}")
    if "cold_repro_s" in dp:
        print(f"cold dvc repro (default data)            {dp['cold_repro_s']:>8} s")
    print(f"no-op repro / empty two-stage no-op      {dp['ratio']:>8}x          <= 1.5x {ok(dp['met'])}")
    print(f"tracking overhead of train               {tr['extra']:>+8.1%}          <= +3%  {ok(tr['met'])}")
    print(f"scaling growth / data ratio (worst)      {sc['worst_growth_over_data_ratio']:>8}"
          f"           <= 1.2  {ok(sc['met'])}")


if __name__ == "__main__":
    main()
