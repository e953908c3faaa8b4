"""Where the trained model lives and how later stages get it back.

`train` writes `paths.train/model.keras` (Keras 3, loads with safe_mode=True)
and `paths.train/resolved_params.yaml` (the config after tune's best values
and train.overrides were merged: the architecture that was really trained).
Later stages rebuild that architecture with the shared builder in their own
Keras world and copy the weights.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tfmlops.artifacts import MODEL_FILE, require
from tfmlops.artifacts import RESOLVED_PARAMS as RESOLVED_FILE
from tfmlops.config import Config, config_from_dict


def trained_model_path(cfg: Config) -> Path:
    return Path(cfg.paths.train) / MODEL_FILE


def trained_config(cfg: Config) -> Config:
    """The config the trained model was built with (paths taken from `cfg`)."""
    what = f"no trained model in {cfg.paths.train}:"
    require(trained_model_path(cfg), "train", f"{what} {MODEL_FILE}")
    path = require(Path(cfg.paths.train) / RESOLVED_FILE, "train", f"{what} {RESOLVED_FILE}")
    tree = yaml.safe_load(path.read_text())
    tree["paths"] = cfg.to_dict()["paths"]
    return config_from_dict(tree)


def write_resolved(cfg: Config, folder: str | Path) -> None:
    (Path(folder) / RESOLVED_FILE).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def load_keras3(path: str | Path):
    """Load a `.keras` file with Keras 3, safe_mode on, project layers registered."""
    import keras

    from tfmlops.model.custom import custom_objects

    return keras.models.load_model(path, custom_objects=custom_objects(keras), safe_mode=True)


def rebuild(model, cfg: Config, keras_module, input_shape, num_classes):
    """The same architecture built in `keras_module`, carrying `model`'s weights."""
    from tfmlops.model import backbones
    from tfmlops.model.builder import build_model

    # a backbone's input layers carry the prepared data's mean/std (not weights): read back
    twin = build_model(cfg.model, keras_module, input_shape, num_classes,
                       input_stats=backbones.input_stats_of(model))
    twin.set_weights(model.get_weights())
    backbones.refresh(twin)
    return twin
