"""One builder for both Keras worlds: the Functional model of a `ModelSpec` in whichever
keras module it is handed, Keras 3 (tune, train) or tf_keras (prune and QAT: tfmot only
works on Keras 2). Same spec, same layer and weight order, so `set_weights(get_weights())`
moves a trained model between the worlds. Pretrained weights are loaded by
`backbones.load_pretrained`, not here: a twin rebuilt to receive weights loads nothing.
"""

from __future__ import annotations

from tfmlops.config import ModelSpec
from tfmlops.errors import ConfigError
from tfmlops.model import backbones
from tfmlops.model.custom import fuse_batch_norm, squeeze_excite_layer


def build_model(spec: ModelSpec, keras, input_shape: tuple[int, int, int], num_classes: int,
                input_stats=None):
    """The model for `spec` in `keras`; `input_stats`: (mean, std) per channel of the
    prepared data, which a backbone needs (model/backbones.py)."""
    check_buildable(spec, input_shape)
    layers = keras.layers
    inputs = keras.Input(shape=input_shape, name="image")
    if spec.backbone != "none":
        x = backbones.features(spec, keras, inputs, input_stats)
    else:
        x = _conv_blocks(spec, keras, inputs)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    if spec.dropout:
        x = layers.Dropout(spec.dropout, name="head_dropout")(x)
    if spec.head_units:
        x = layers.Dense(spec.head_units, activation=spec.activation, name="head_dense")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    # float32 whatever the global policy: softmax/loss in float16 lose precision.
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    return fuse_batch_norm(keras.Model(inputs, outputs, name="classifier"), keras)


def _conv_blocks(spec: ModelSpec, keras, x):
    layers = keras.layers
    for b, block in enumerate(spec.blocks):
        conv = layers.SeparableConv2D if block.separable else layers.Conv2D
        for c in range(spec.convs_per_block):
            x = conv(block.filters, block.kernel_size, padding="same", use_bias=not spec.batch_norm,
                     name=f"block{b}_conv{c}")(x)
            if spec.batch_norm:
                x = layers.BatchNormalization(momentum=spec.bn_momentum, name=f"block{b}_bn{c}")(x)
            x = layers.Activation(spec.activation, name=f"block{b}_act{c}")(x)
        if spec.squeeze_excite:
            x = squeeze_excite_layer(keras)(name=f"block{b}_se")(x)
        if b < len(spec.blocks) - 1:  # the last block feeds global pooling instead
            pool = layers.MaxPooling2D if spec.pooling == "max" else layers.AveragePooling2D
            x = pool(2, name=f"block{b}_pool")(x)
    return x


def check_buildable(spec: ModelSpec, input_shape: tuple[int, int, int]) -> None:
    """Fail before TensorFlow work if the spec cannot be built for this input."""
    size = min(input_shape[:2])
    if spec.backbone != "none":
        if size < 32:
            raise ConfigError(
                f"model.backbone: {spec.backbone} needs inputs of at least 32x32, data.image_size "
                f"is {size}; raise data.image_size or use backbone: none")
        return
    pools = len(spec.blocks) - 1
    if size // 2**pools < 1:
        raise ConfigError(
            f"model.blocks: {len(spec.blocks)} blocks pool {pools} times, more than a "
            f"{size}x{size} input allows (at most {size.bit_length() - 1} pools); remove blocks or "
            "raise data.image_size")
