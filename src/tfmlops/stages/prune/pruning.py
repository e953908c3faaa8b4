"""tfmot magnitude pruning of a tf_keras model (run with TF_USE_LEGACY_KERAS=1).

Every layer tfmot supports is wrapped in `PruneLowMagnitude` (as tfmot's own
whole-model call does); a layer it cannot prune (e.g. the project's
SqueezeExcite) is left dense and named, instead of failing the whole model.
After fine-tuning, BatchNormalization statistics are re-estimated on train
images (`recalibrated_batch_norm`). The schedule's steps (`pruning_steps`) come
from params alone: the stage derives them before TensorFlow loads (no module-level
TensorFlow import here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfmlops.config import PruneConfig


@dataclass(frozen=True)
class PruningSteps:
    steps_per_epoch: int
    total_steps: int
    begin_step: int
    end_step: int
    frequency: int


def pruning_steps(p: PruneConfig, train_examples: int, batch_size: int) -> PruningSteps:
    """Begin/end steps of tfmot's PolynomialDecay for `p.epochs` of fine-tuning.

    tfmot counts training steps from 1 and updates the masks only when
    `(step - begin) % frequency == 0` and `step <= end`: an end step that is
    not on that grid stops one update short of `final_sparsity`. So the end
    step is moved down onto the grid, and the frequency is shrunk when the
    pruning window is shorter than one update.
    """
    steps_per_epoch = max(1, math.ceil(train_examples / batch_size))
    total = p.epochs * steps_per_epoch
    begin = min(int(p.begin_fraction * total), total - 1)
    end = max(begin + 1, min(total, round(p.end_fraction * total)))
    frequency = max(1, min(p.frequency, end - begin))
    end = begin + (end - begin) // frequency * frequency
    return PruningSteps(steps_per_epoch, total, begin, end, frequency)


def polynomial_decay(p: PruneConfig, steps: PruningSteps):
    import tensorflow_model_optimization as tfmot

    return tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=p.initial_sparsity, final_sparsity=p.final_sparsity,
        begin_step=steps.begin_step, end_step=steps.end_step, frequency=steps.frequency)


def recalibrated_batch_norm(model, images, keras):
    """A copy of `model` whose BatchNormalization moving mean/variance are the
    exact statistics of each layer's input over `images` (train images).

    Pruning changes what each layer sees while the moving statistics trail
    behind (seen on digits: 0.79 training accuracy, 0.25 test accuracy after
    a short fine-tune). Re-estimating them once after fine-tuning is exact
    and cheap.
    """
    import numpy as np

    # A fresh graph: the stripped model's layers also sit in the pruning and
    # the original graphs, so their `.input` would point there.
    weights = model.get_weights()
    model = keras.models.clone_model(model)
    model.set_weights(weights)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            upstream = keras.Model(model.inputs, layer.input)
            acts = upstream.predict(images, batch_size=256, verbose=0)
            axes = tuple(range(acts.ndim - 1))
            layer.moving_mean.assign(np.mean(acts, axis=axes))
            layer.moving_variance.assign(np.var(acts, axis=axes))
    return model


def prunable_clone(model, schedule, keras):
    """(a clone with prunable layers wrapped, names of weighted layers left dense).

    Like tfmot's own `prune_low_magnitude(model)`, the clone shares the
    original layers' weights: measure the original before fine-tuning.
    """
    import tensorflow_model_optimization as tfmot

    left_dense: list[str] = []

    def wrap(layer):
        try:
            return tfmot.sparsity.keras.prune_low_magnitude(layer, pruning_schedule=schedule)
        except ValueError:  # not in tfmot's registry and not a PrunableLayer
            if layer.weights:
                left_dense.append(layer.name)
            return layer

    return keras.models.clone_model(model, clone_function=wrap), left_dense


def callbacks(log_dir: str, profile_batch):
    """UpdatePruningStep (required) and PruningSummaries (TensorBoard, + profiler)."""
    import tensorflow_model_optimization as tfmot

    return [tfmot.sparsity.keras.UpdatePruningStep(),
            tfmot.sparsity.keras.PruningSummaries(log_dir=log_dir, profile_batch=profile_batch,
                                                  write_graph=False)]


def keep_best_pruned(keras, end_step: int, steps_per_epoch: int,
                     recovered: tuple[int, int] | None = None):
    """A callback that keeps the weights of the fine-tuning epoch with the lowest
    val_loss among those that end at full sparsity (after `end_step`).

    The epochs after the schedule's end only recover accuracy; which one
    recovers most varies with the run, so the stage keeps the best one, as
    `train` keeps its lowest-val_loss epoch. `restore()` puts it back.

    `recovered` (images the trained model gets right, validation images): the fit stops
    after the first full-sparsity epoch that gets at least as many right
    (`prune.stop_when_recovered`; `stopped_at_epoch` says which). Counted in images, not
    compared as floats: Keras' float32 accuracy of 99/102 is below the float64 ratio.
    """

    class KeepBestPruned(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.best_loss, self.best_epoch, self._weights = float("inf"), None, None
            self.stopped_at_epoch: int | None = None

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            loss = logs.get("val_loss")
            full_sparsity = (epoch + 1) * steps_per_epoch >= end_step
            if full_sparsity and loss is not None and loss < self.best_loss:
                self.best_loss, self.best_epoch = float(loss), epoch + 1  # 1-based, as train's
                self._weights = self.model.get_weights()
            if full_sparsity and recovered is not None and "val_accuracy" in logs:
                right, images = recovered
                if round(float(logs["val_accuracy"]) * images) >= right:
                    self.stopped_at_epoch = epoch + 1
                    self.model.stop_training = True

        def restore(self) -> int | None:
            if self._weights is not None:
                self.model.set_weights(self._weights)
            return self.best_epoch

    return KeepBestPruned()


def pruned_weight_names(wrapped_model) -> dict[str, set[str]]:
    """Layer name -> names of the weights tfmot pruned in it."""
    return {layer.layer.name: {w.name for w, _mask, _threshold in layer.pruning_vars}
            for layer in wrapped_model.layers
            if hasattr(layer, "pruning_vars")}  # a PruneLowMagnitude wrapper


def strip(wrapped_model):
    import tensorflow_model_optimization as tfmot

    return tfmot.sparsity.keras.strip_pruning(wrapped_model)


def layer_weights(stripped_model, pruned: dict[str, set[str]]):
    """(name, all weights, pruned weights) per layer, for `measure.sparsity_table`."""
    for layer in stripped_model.layers:
        names = pruned.get(layer.name, set())
        yield (layer.name, [w.numpy() for w in layer.weights],
               [w.numpy() for w in layer.weights if w.name in names])
