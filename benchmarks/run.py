"""All benchmarks in one run: every figure a ratio measured side by side.

    .venv/bin/python benchmarks/run.py [--skip-cold REPO] [--quick] [--photos]

1. input pipeline vs a PIL generator (mostly tf.data's cache), the same with the
   cache off, and the input-wait share of a training step (from the cold repro's
   train profiler trace);
2. training throughput: pipeline vs in-memory tensors;
3. inference: the served runtime vs the fastest runtime passing float parity, the
   INT8 edge file beside it (on the cold repro's exports);
4. pipeline: cold `dvc repro` on the default data; no-op repro vs an empty two-stage one;
5. tracking overhead of the train stage (fresh processes, alternated, best of 3);
6. scaling on the synthetic dataset at 1x/4x/16x, with accuracy beside time;
7. HTTP: the served pyfunc vs MLflow's plain Keras flavor, and requests/s with 8
   concurrent clients vs 1 (real `mlflow models serve` on the cold repro's model).

`--quick` runs every row small (a reduced pipeline, few epochs and requests): it checks
that they run; its figures are not the project's. `--photos` adds issue 12's rows on
generated phone-size photos (made on first use, kept in the temp folder), each script in
its own process and runnable alone: benchmarks/prepare_photos.py (rows 1-4: prepare vs a
PIL loop, peak RSS at 1x/4x, bytes, incremental -> reports/benchmarks/prepare_photos.json)
and benchmarks/train_photos.py (row 5: train at 1x/4x with `cache: auto`).

Writes reports/benchmarks/run.json (all results, the machine, the command; --quick:
reports/benchmarks/run_quick.json; both git-ignored, as all of reports/) and prints a
summary; BENCHMARKS.md quotes a run of it.
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
from common import RESULTS, machine  # noqa: E402

OUT = RESULTS / "run.json"
QUICK_OUT = RESULTS / "run_quick.json"  # a check's figures never replace a run's


def inference_in_own_process(repo: Path, runs: int, quick: bool) -> dict:
    """TensorFlow's thread counts are fixed at its start: a fresh process sets them to 1."""
    subprocess.run([sys.executable, str(Path(__file__).with_name("inference.py")),
                    "--repo", str(repo), "--runs", str(runs), *(["--quick"] if quick else [])],
                   check=True)
    return json.loads((RESULTS / "inference.json").read_text())


def photos_in_own_process(quick: bool) -> dict:
    """Issue 12's photo rows, each script in its own process: `prepare` (rows 1-4: speed
    vs a PIL loop, peak RSS at 1x/4x, bytes, incremental) and `train` (row 5: images/s
    and peak RSS at 1x/4x with `cache: auto`) on generated phone-size photos."""
    here = Path(__file__).parent
    subprocess.run([sys.executable, str(here / "prepare_photos.py"),
                    *(["--images", "200"] if quick else [])], check=True)
    subprocess.run([sys.executable, str(here / "train_photos.py"),
                    *(["--images", "60", "--epochs", "1"] if quick else [])], check=True)
    return {"prepare": json.loads((RESULTS / "prepare_photos.json").read_text()),
            "train": json.loads((RESULTS / "train_photos.json").read_text())}


def serving_in_own_process(repo: Path, quick: bool) -> dict:
    """Its own process: it points MLflow at the repo's store and serves its @production."""
    subprocess.run([sys.executable, str(Path(__file__).with_name("serving.py")),
                    "--repo", str(repo), *(["--quick"] if quick else [])], check=True)
    return json.loads((RESULTS / "serving.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", type=Path,
                        help="reuse a project copy already reproduced by an earlier run")
    parser.add_argument("--quick", action="store_true",
                        help="every row small: checks they run (not the project's figures)")
    parser.add_argument("--photos", action="store_true",
                        help="also the photo rows (issue 12): generates thousands of photos "
                             "on first use (kept in the temp folder), about 10 minutes more")
    args = parser.parse_args()
    quick = args.quick
    out = QUICK_OUT if quick else OUT
    started = time.perf_counter()
    results: dict = {"command": " ".join(["benchmarks/run.py", *sys.argv[1:]]),
                     "machine": machine()}

    def step(name, fn, *a, **kw):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        result = fn(*a, **kw)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = result
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")  # a crash keeps the rest
        return result

    small = training.QUICK if quick else {k: {} for k in training.QUICK}
    results["quick"] = quick
    pipeline_result = step("dvc_pipeline", lambda: dvc_pipeline.measure(
        1 if quick else 3, args.skip_cold, quick)[0])
    repo = Path(pipeline_result["repo"])
    train_report = json.loads((repo / "reports" / "train.json").read_text())
    ip = step("input_pipeline", lambda: input_pipeline.measure(3, 1, rounds=1) if quick
              else input_pipeline.measure())
    ip["input_wait_share"] = train_report.get("profile_input_wait_share")
    ip["input_wait_target"] = 0.05
    ip["input_wait_met"] = ip["input_wait_share"] is not None and ip["input_wait_share"] < 0.05
    step("training_throughput", training.throughput, **small["throughput"])
    step("inference", inference_in_own_process, repo, 300, quick)
    step("training_tracking", training.tracking, **small["tracking"])
    step("training_scaling", training.scaling, **small["scaling"])
    step("serving", serving_in_own_process, repo, quick)
    if args.photos:
        step("photos", photos_in_own_process, quick)
    results["total_seconds"] = round(time.perf_counter() - started, 1)

    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_summary(results)
    print(f"-> {out} ({results['total_seconds']} s)")


def print_summary(r: dict) -> None:
    ok = lambda met: "met" if met else "MISSED"  # noqa: E731
    ip, tt, inf = r["input_pipeline"], r["training_throughput"], r["inference"]
    dp, tr, sc, sv = r["dvc_pipeline"], r["training_tracking"], r["training_scaling"], r["serving"]
    if r.get("quick"):
        print("\n--quick: small sizes, a check that every row runs; not the project's figures")
    print("\nfigure                                        measured         target      ")
    print(f"1 input pipeline vs PIL generator (cache)     {ip['ratio']:>8}x        >= 20x  "
          f"{ok(ip['met'])}")
    print(f"1 the same, cache off (decode every epoch)    {ip['uncached_ratio']:>8}x")
    wait = ip["input_wait_share"]
    shown = "n/a" if wait is None else f"{wait:.2%}"  # no train profile (profiling off)
    print(f"1 input wait share of a train step            {shown:>9}"
          f"        < 5%    {ok(ip['input_wait_met'])}")
    print(f"2 train throughput pipeline/in-memory         {tt['ratio']:>8}x        >= 0.9x "
          f"{ok(tt['met'])}")
    print(f"3 served ({inf['served_runtime']}) p50 / fastest faithful "
          f"({inf['fastest_faithful']}) {inf['served_p50_vs_fastest_faithful']}x <= "
          f"{inf['target']}x {ok(inf['met'])}; edge file ({inf['edge'].get('variant')}) p50 "
          f"{inf['edge']['p50_vs_served']}x served, top-1 agreement "
          f"{inf['edge']['top1_agreement']}")
    if "cold_repro_s" in dp:
        print(f"4 cold dvc repro                              {dp['cold_repro_s']:>8} s")
    print(f"4 no-op repro / empty two-stage no-op         {dp['ratio']:>8}x        <= 1.5x "
          f"{ok(dp['met'])}")
    print(f"5 tracking overhead of train                  {tr['extra']:>+8.1%}         <= +3%  "
          f"{ok(tr['met'])}")
    accuracies = " / ".join(f"{row['test_accuracy']:.3f}" for row in sc["rows"])
    print(f"6 scaling growth / data ratio (worst)         {sc['worst_growth_over_data_ratio']:>8}"
          f"          <= 1.2  {ok(sc['met'])} (accuracy {accuracies})")
    print(f"7 HTTP keras flavor p50 / served pyfunc p50   {sv['keras_over_pyfunc_p50']:>8}x")
    print(f"7 pyfunc requests/s, 8 clients / 1 client     {sv['eight_over_one_client']:>8}x "
          f"({sv['pyfunc_8_clients']['requests_per_s']} vs "
          f"{sv['pyfunc_1_client']['requests_per_s']} req/s)")
    if "photos" in r:
        print_photos(r["photos"])


def print_photos(photos: dict) -> None:
    """Issue 12's rows: prepare's own summary, then train's memory ratio per cache budget."""
    import prepare_photos

    prepare_photos.print_summary(photos["prepare"])
    train = photos["train"]
    for budget, ratio in train["peak_rss_ratio_by_budget"].items():
        print(f"5. train peak RSS 4x / 1x, cache budget {budget} MB   {ratio}x   <= 1.5x   "
              f"{'met' if ratio <= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
