"""Pruning-preserving quantization-aware training of the pruned model (tfmot).

Every layer tfmot's default 8-bit registry supports is annotated (plus
BatchNormalization, which tfmot folds into the convolution before it); the
rest stay float and are named. `Default8BitPrunePreserveQuantizeScheme`
keeps the pruned zeros at zero through the fine-tune. BatchNormalization is
frozen (inference mode): `prune` re-estimated its statistics exactly, and a
short fine-tune would leave them trailing behind the weights.
"""

from __future__ import annotations


def quantize_aware(model, keras) -> tuple[object, list[str]]:
    """(the QAT model, names of weighted layers left unquantized)."""
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry_module,
    )

    from tfmlops.model.custom import custom_objects

    q = tfmot.quantization.keras
    registry = registry_module.Default8BitQuantizeRegistry()
    left_float: list[str] = []

    def annotate(layer):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False  # carried into the clone by its config
        if registry.supports(layer) or isinstance(layer, keras.layers.BatchNormalization):
            return q.quantize_annotate_layer(layer)
        if layer.weights:
            left_float.append(layer.name)
        return layer

    annotated = keras.models.clone_model(model, clone_function=annotate)
    with q.quantize_scope(custom_objects(keras)):
        qat_model = q.quantize_apply(
            annotated, tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme()
        )
    return qat_model, left_float


def fine_tune(qat_model, dataset, epochs: int, learning_rate: float, loss, keras, verbose: int,
              callbacks=()):
    qat_model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss,
                      metrics=["accuracy"])
    history = qat_model.fit(dataset, epochs=epochs, verbose=verbose, callbacks=list(callbacks))
    return {k: float(v[-1]) for k, v in history.history.items()}
