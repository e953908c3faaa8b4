"""Precision figures (issue 13), measured side by side in one process:

- speed: training images/s of `train.precision: auto` (as the train stage resolves
  it on this machine: timed on a CPU with bf16 units, float32 elsewhere) against
  float32, and of mixed_bfloat16 for reference, on the default digits CNN and on
  MobileNetV3Small at 96x96 RGB (keras.applications, weights=None, random inputs).
  Targets: auto >= 2x float32 on the digits CNN on a CPU with bf16 units; auto
  never slower than float32 on MobileNetV3Small;
- accuracy: the default digits pipeline's train stage (tune's settings not used)
  in float32 and in mixed_bfloat16; target: bf16 test accuracy within 0.5 pt;
- noise: float32 timed against float32, as `train.precision: timed` times a policy
  (warm-up, then the median of a few steps), `--rounds` times: how far apart two timings
  of the same policy land. `train.precision_margin` must be above the widest gap, or a
  timing can pick bf16 for nothing (its default is set from this figure).

    .venv/bin/python benchmarks/precision.py [speed|accuracy|noise ...] [--steps N] [--epochs N]

The output says which CPU it ran on and whether it has bf16 units: without them
bf16 is emulated and `auto` is float32 (nothing is timed).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import save, scratch_config  # noqa: E402

log = logging.getLogger("tfmlops.benchmarks.precision")
MOBILENET_SIZE = 96


def cpu() -> dict:
    from tfmlops.model import precision

    flags = precision.cpu_flags()
    name = "unknown"
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return {"cpu": name, "bf16_units": precision.has_bf16_units(flags),
            "bf16_flags": sorted(set(flags) & set(precision.BF16_FLAGS)),
            "simd": sorted(f for f in flags if f in ("avx", "avx2", "avx512f", "amx_tile"))}


def prepared(workdir: Path, **train):
    from tfmlops.stages import materialize, prepare

    cfg, _ = scratch_config(workdir, train={"use_tuned": False, **train})
    materialize.run(cfg)
    prepare.run(cfg)
    return cfg


def digits_case(workdir: Path):
    """(make_model, batch, decide) for the default digits CNN as `train` compiles it."""
    import keras

    from tfmlops.data import pipeline
    from tfmlops.model import fitting

    cfg = prepared(workdir)
    data = pipeline.load_prepared(cfg)
    train_ds, _, steps = fitting.datasets(cfg, data, cfg.train.batch_size)
    batch = next(iter(train_ds))
    return (lambda: fitting.compiled_model(cfg, data, keras, steps * cfg.train.epochs), batch,
            lambda: fitting.choose_precision(cfg, data, cfg.train.batch_size))


def mobilenet_case(batch_size: int):
    """(make_model, batch, decide) for MobileNetV3Small at 96x96, timed the way auto times."""
    import keras
    import numpy as np

    from tfmlops.model import precision

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (batch_size, MOBILENET_SIZE, MOBILENET_SIZE, 3)).astype("float32")
    batch = (x, rng.integers(0, 10, batch_size))

    def make_model():
        model = keras.applications.MobileNetV3Small(
            input_shape=(MOBILENET_SIZE, MOBILENET_SIZE, 3), weights=None, classes=10)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model

    def decide():
        return precision.choose_policy("auto", precision.gpu_capabilities(), precision.cpu_flags(),
                                lambda: precision.time_policies(make_model, batch, keras))

    return make_model, batch, decide


def speed(steps: int = 10, warmup: int = 2) -> dict:
    import keras

    from tfmlops.model import precision

    out = {}
    cases = {"digits_cnn": lambda: digits_case(Path(tempfile.mkdtemp(prefix="bench-prec-"))),
             "mobilenet_v3_small_96": lambda: mobilenet_case(64)}
    for name, case in cases.items():
        make_model, batch, decide = case()
        decision = decide()
        rates = precision.time_policies(make_model, batch, keras, ("float32", "mixed_bfloat16"),
                                        warmup=warmup, steps=steps)
        auto = rates[decision.policy]  # the policy auto picked, timed beside the others
        out[name] = {"auto_policy": decision.policy, "auto_reason": decision.reason,
                     "float32_images_per_s": round(rates["float32"], 1),
                     "mixed_bfloat16_images_per_s": round(rates["mixed_bfloat16"], 1),
                     "auto_images_per_s": round(auto, 1),
                     "auto_vs_float32": round(auto / rates["float32"], 3),
                     "bf16_vs_float32": round(rates["mixed_bfloat16"] / rates["float32"], 3)}
        log.info(f"{name}: float32 {rates['float32']:,.0f} img/s, auto ({decision.policy}) "
                 f"{auto:,.0f} img/s = {auto / rates['float32']:.2f}x, mixed_bfloat16 "
                 f"{rates['mixed_bfloat16']:,.0f} img/s")
    return out


def noise(rounds: int = 10) -> dict:
    """Two float32 timings of the digits CNN per round, as `timed` takes them."""
    import keras

    from tfmlops.model import precision

    make_model, batch, _ = digits_case(Path(tempfile.mkdtemp(prefix="bench-prec-")))
    ratios = []
    for _ in range(rounds):
        first, second = (precision.time_policies(make_model, batch, keras, ("float32",))["float32"]
                         for _ in range(2))
        ratios.append(max(first, second) / min(first, second))
    widest = max(ratios) - 1
    log.info(f"float32 vs float32, {rounds} rounds: the faster timing was up to "
             f"{100 * widest:.1f}% above the slower (median {100 * (sorted(ratios)[rounds // 2] - 1):.1f}%)")
    return {"rounds": rounds, "ratios": [round(r, 4) for r in ratios],
            "widest_gap": round(widest, 4)}


def accuracy(epochs: int | None = None) -> dict:
    """The default digits train stage in float32 and in mixed_bfloat16 (same seed, data).
    `epochs`: fewer than the params' where bf16 is emulated (it runs ~10x slower)."""
    from tfmlops.stages import train

    out = {}
    for policy in ("float32", "mixed_bfloat16"):
        extra = {"epochs": epochs} if epochs else {}
        cfg = prepared(Path(tempfile.mkdtemp(prefix="bench-prec-")), precision=policy, **extra)
        metrics = train.run(cfg)
        out[policy] = {"test_accuracy": metrics["test_accuracy"],
                       "epochs_run": metrics["epochs_run"],
                       "images_per_s": round(metrics["images_per_s"], 1)}
    gap = 100 * (out["float32"]["test_accuracy"] - out["mixed_bfloat16"]["test_accuracy"])
    out["float32_minus_bf16_points"] = round(gap, 2)
    out["within_0_5_pt"] = abs(gap) <= 0.5
    log.info(f"digits test accuracy: float32 {out['float32']['test_accuracy']:.4f}, "
             f"mixed_bfloat16 {out['mixed_bfloat16']['test_accuracy']:.4f} "
             f"({gap:+.2f} pt float32 - bf16)")
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="*", default=["speed", "accuracy"],
                        choices=["speed", "accuracy", "noise"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per policy")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=10, help="noise: timing pairs")
    parser.add_argument("--epochs", type=int, default=None,
                        help="accuracy: train epochs (default: params.yaml's)")
    args = parser.parse_args()
    result = {"cpu": cpu()}
    log.info(f"CPU: {result['cpu']['cpu']}; bf16 units: "
             f"{', '.join(result['cpu']['bf16_flags']) or 'none'} "
             f"(SIMD: {' '.join(result['cpu']['simd'])})")
    if "speed" in args.which:
        result["speed"] = speed(args.steps, args.warmup)
    if "accuracy" in args.which:
        result["accuracy"] = accuracy(args.epochs)
    if "noise" in args.which:
        result["noise"] = noise(args.rounds)
    log.info(f"-> {save('precision', result)}")


if __name__ == "__main__":
    main()
