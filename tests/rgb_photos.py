"""The one RGB photo pipeline of the suite: phone-like photos (JPEG, a few PNGs, EXIF-
rotated JPEGs) at 32 px through the whole `dvc repro` with a pretrained backbone.

The photo, backbone and skew tests all read this one run (built once per session by
conftest's `rgb_photo_repo`). Offline: the "pretrained" weights are a randomly
initialised MobileNetV3Small whose BatchNormalization statistics were set from one
batch (so its inference-mode features do not vanish), saved as a local weights file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

WEIGHTS = "weights/mobilenet_v3_small.weights.h5"
CLASSES = 3
CHANCE = 1 / CLASSES + 0.01
ROTATED = "class_00/img_000003.jpg"  # the generator stores it sideways, EXIF orientation 6


def params(photos: Path) -> dict:
    from conftest import LOOSE_GATE, relative_tiny_params

    return relative_tiny_params(
        # One shard: the skew test reads the stored images back in order.
        data={"image_dir": str(photos), "channels": 3, "image_size": 32, "shards": 1},
        model={"backbone": "mobilenet_v3_small", "backbone_weights": WEIGHTS, "head_units": 0},
        train={"epochs": 2, "batch_size": 16, "precision": "float32",
               "fine_tune": {"head_epochs": 1, "unfreeze": 0.2, "lr_factor": 0.1}},
        # No search: a backbone's trials run the same fit_in_phases as train.
        tune={"enabled": False},
        # Two conversions, not nine (each takes about 30 s on a backbone): full INT8 of the
        # pruned and of the trained model.
        quantize={"representative_samples": 16, "variants": ["int8"]},
        # The photos' stored JPEGs are re-encoded at 32 px: a model barely above chance (this
        # random-feature backbone: 0.5 on 3 classes) flips near-ties on that noise (top-1
        # agreement 0.84 measured). The strict pairs (stored bytes, atol 1e-4) still hold.
        export={"skew": {"source_min_agreement": 0.7}},
        # Above chance: the gate's pass means the backbone model learned something.
        promote={"gate": {**LOOSE_GATE, "min_accuracy": CHANCE, "max_latency_ms": 1000.0,
                          "max_size_bytes": 100_000_000}},
    )


def prepare(root: Path, repo: Path) -> None:
    """Before the repro: the photos in `root/photos`, the pretend-pretrained weights."""
    from images import phone_photo_folder

    phone_photo_folder(root / "photos", images=120, classes=CLASSES)
    save_pretend_pretrained(repo / WEIGHTS)


def save_pretend_pretrained(path: Path) -> None:
    import keras

    from tfmlops.model import backbones

    keras.utils.set_random_seed(0)
    base = backbones.application("mobilenet_v3_small", keras, input_shape=(32, 32, 3))
    bns = [layer for layer in base.layers if type(layer).__name__ == "BatchNormalization"]
    for bn in bns:
        bn.momentum = 0.0  # moving statistics := this batch's
    x = np.random.default_rng(0).uniform(0, 255, (16, 32, 32, 3)).astype("float32")
    head = keras.Sequential([base, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    head.compile(optimizer=keras.optimizers.SGD(1e-6), loss="mse")
    head.fit(x, np.zeros((16, 2), "float32"), batch_size=16, epochs=1, verbose=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    base.save_weights(path)


def absolute_config(repo: Path, dest: Path):
    """The repo's Config with every path made absolute (written to `dest/params.yaml`), for
    stage code run in this process without changing its working folder."""
    from tfmlops.config import load_config

    data = yaml.safe_load((repo / "params.yaml").read_text())
    data["paths"] = {k: str(repo / v) for k, v in data["paths"].items()}
    data["tracking"]["uri"] = f"sqlite:///{repo / 'mlflow.db'}"
    data["data"]["contract"]["reference"] = str(repo / data["data"]["contract"]["reference"])
    data["model"]["backbone_weights"] = str(repo / WEIGHTS)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(dest / "params.yaml")
