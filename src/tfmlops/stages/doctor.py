"""`tfmlops doctor`: what this machine resolves the train stage to, checked by training.

Trains two epochs of the params' model with the params' train settings (precision,
strategy, replicas, jit_compile, batch size) on the built-in digits, through the real
`materialize`, `prepare` and `train` stages, all in a temporary folder with its own
MLflow store, then prints what the run resolved: the precision policy (and whether the
loss is scaled), the strategy and its replicas, the devices TensorFlow placed them on,
XLA. This is how a user checks the GPU-only paths (mixed_float16, MirroredStrategy over
GPUs, XLA `auto`) that no test here can run. Nothing of the project is touched.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import yaml

from tfmlops.config import Config, load_config

log = logging.getLogger(__name__)

EPOCHS = 2


def scratch_params(cfg: Config, folder: Path) -> dict:
    """The params with the built-in digits, two epochs, no search, no profiling, every
    path and the tracking store under `folder`."""
    params = cfg.to_dict()
    params["paths"] = {k: str(folder / k) for k in params["paths"]}
    params["data"].update(builtin="digits", channels=1, image_dir=params["paths"]["builtin"])
    params["train"].update(epochs=EPOCHS, use_tuned=False, early_stopping_patience=0)
    params["tracking"].update(enabled=True, uri=f"sqlite:///{folder / 'mlflow.db'}")
    params["profiling"]["enabled"] = False
    return params


def run(cfg: Config) -> dict:
    from tfmlops.stages import materialize, prepare, train

    with tempfile.TemporaryDirectory(prefix="tfmlops-doctor-") as tmp:
        folder = Path(tmp)
        (folder / "params.yaml").write_text(yaml.safe_dump(scratch_params(cfg, folder)))
        small = load_config(folder / "params.yaml")
        # The variable would win over the scratch store: the check records nowhere else.
        saved_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
        try:
            log.info(f"doctor: training {EPOCHS} epochs of the params' model on the built-in "
                     f"digits in {folder}")
            materialize.run(small)
            prepare.run(small)
            metrics = train.run(small)
            resolved = _resolved(small, folder)
        finally:
            if saved_uri is not None:
                os.environ["MLFLOW_TRACKING_URI"] = saved_uri
    result = {**resolved, "epochs_run": metrics["epochs_run"],
              "test_accuracy": round(metrics["test_accuracy"], 4),
              "images_per_s": metrics["images_per_s"]}
    log.info(_line(result))
    return result


def _resolved(cfg: Config, folder: Path) -> dict:
    """What the train run recorded it resolved (its MLflow params), and the devices."""
    import tensorflow as tf

    from tfmlops.tracking import read_run_file, use_uri

    run_id = read_run_file(cfg.paths.train)["run_id"]
    params = use_uri(f"sqlite:///{folder / 'mlflow.db'}").MlflowClient().get_run(run_id).data.params
    keys = ("precision_policy", "loss_scaling", "strategy", "strategy_class", "jit_compile")
    return {**{k: params.get(f"resolved.{k}") for k in keys},
            "replicas": int(params.get("resolved.replicas", 1)),
            "devices": [d.name for d in tf.config.list_logical_devices()],
            "gpus": [d.name for d in tf.config.list_physical_devices("GPU")]}


def _line(r: dict) -> str:
    return (f"doctor: precision {r['precision_policy']} (loss scaling {r['loss_scaling']}), "
            f"strategy {r['strategy']} ({r['strategy_class']}, {r['replicas']} replica(s)), "
            f"devices {', '.join(r['devices'])}, GPUs {len(r['gpus'])}, XLA jit_compile "
            f"{r['jit_compile']}; {r['epochs_run']} epochs, test accuracy {r['test_accuracy']}")
