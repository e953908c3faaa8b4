"""The models the two stages start from, in the tf_keras world tfmot needs.

Checks (`pruned_path`, `train_split_size`; model/artifacts.trained_config) import no TensorFlow,
so bad input fails in a second. The loaders read the trained Keras 3 file
with Keras 3 (the `keras` package stays Keras 3 under TF_USE_LEGACY_KERAS=1),
rebuild the architecture in tf_keras with the shared builder and copy the
weights (PITFALLS: get_config/from_config across the worlds fails).
"""

from __future__ import annotations

from pathlib import Path

from tfmlops.artifacts import MANIFEST, read_manifest, require
from tfmlops.config import Config
from tfmlops.model.trained import MODEL_FILE, trained_model_path


def pruned_path(cfg: Config) -> Path:
    return require(Path(cfg.paths.pruned) / MODEL_FILE, "prune",
                   f"no pruned model in {cfg.paths.pruned}:")


def train_split_size(cfg: Config) -> int:
    """Train examples, from prepare's manifest (no TensorFlow needed)."""
    manifest = read_manifest(cfg.paths.prepared, f"prepared data ({MANIFEST}) in {cfg.paths.prepared}")
    return int(manifest["split_counts"]["train"])


def tf_keras_module():
    import tf_keras

    return tf_keras


def load_trained(cfg: Config, tcfg: Config, prepared):
    """(the Keras 3 model as trained, its tf_keras twin with the same weights)."""
    from tfmlops.model.trained import load_keras3, rebuild

    original = load_keras3(trained_model_path(cfg))
    twin = rebuild(original, tcfg, tf_keras_module(), prepared.input_shape, prepared.num_classes)
    return original, twin


def load_pruned(cfg: Config):
    """The stripped pruned model written by `prune` (tf_keras format)."""
    from tfmlops.model.custom import custom_objects

    keras = tf_keras_module()
    return keras.models.load_model(pruned_path(cfg), custom_objects=custom_objects(keras),
                                   compile=False)
