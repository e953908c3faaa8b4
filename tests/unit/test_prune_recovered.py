"""prune ends its fine-tuning at the first full-sparsity epoch that gets as many validation
images right as the trained model (`prune.stop_when_recovered`): a real tf_keras fit of a
tiny model on separable data, through the stage's own callback."""

from __future__ import annotations

import numpy as np
import pytest

from tfmlops.stages.prune.pruning import keep_best_pruned

EPOCHS, STEPS = 6, 4  # 4 batches of 8 a epoch


def fit(recovered, end_step):
    """(epochs run, the callback) of a 6-epoch fit whose validation accuracy is 1.0 from
    the first epoch on (two well-separated classes)."""
    from tfmlops.compress.source import tf_keras_module

    keras = tf_keras_module()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 16)
    x = (0.5 * rng.normal(size=(32, 2)) + 4.0 * (2 * y[:, None] - 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    keep = keep_best_pruned(keras, end_step, STEPS, recovered)
    history = model.fit(x, y, batch_size=8, epochs=EPOCHS, validation_data=(x, y),
                        callbacks=[keep], verbose=0, shuffle=False)
    assert history.history["val_accuracy"][-1] == 1.0  # the data are what the cases assume
    return len(history.history["loss"]), keep


@pytest.mark.timeout(120)
def test_the_fit_ends_at_the_first_full_sparsity_epoch_that_recovered():
    # full sparsity from the end of epoch 3 (step 12): recovered at once, so it ends there
    epochs, keep = fit(recovered=(32, 32), end_step=3 * STEPS)
    assert (epochs, keep.stopped_at_epoch) == (3, 3)
    assert keep.best_epoch == 3  # the only full-sparsity epoch run: the one kept


@pytest.mark.timeout(120)
def test_no_stop_before_full_sparsity_nor_short_of_the_trained_models_count():
    # recovered before full sparsity does not count: the schedule has not ended yet
    epochs, keep = fit(recovered=(32, 32), end_step=EPOCHS * STEPS)
    assert (epochs, keep.stopped_at_epoch) == (EPOCHS, EPOCHS)
    # one image more than the data allow: never recovered, every epoch runs
    epochs, keep = fit(recovered=(33, 32), end_step=STEPS)
    assert (epochs, keep.stopped_at_epoch) == (EPOCHS, None)
    # the rule off
    epochs, keep = fit(recovered=None, end_step=STEPS)
    assert (epochs, keep.stopped_at_epoch) == (EPOCHS, None)


def test_the_count_is_compared_in_images_not_float32_accuracies():
    """99 of 102 right: Keras' float32 accuracy (0.97058821) is below the float64 ratio,
    so comparing the floats would not see the trained model's count again."""
    from tfmlops.compress.source import tf_keras_module

    keras = tf_keras_module()
    keep = keep_best_pruned(keras, 1, STEPS, (99, 102))
    keep.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]))
    logs = {"val_loss": 0.1, "val_accuracy": float(np.float32(99 / 102))}
    assert logs["val_accuracy"] < 99 / 102  # the case this guards
    keep.on_epoch_end(0, logs)
    assert keep.stopped_at_epoch == 1 and keep.model.stop_training
