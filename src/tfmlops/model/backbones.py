"""Pretrained backbones: which Keras applications, where their ImageNet weights
live, the input layers in front of them and the freezing of two-phase fine-tuning.

- The model's input stays what the pipeline and serving give: floats normalised
  by the prepared data's per-channel mean/std. In front of the backbone,
  `to_pixels` (a plain Rescaling) undoes that back to 0..255 pixels, `to_rgb`
  (a Concatenate) repeats one channel to three, and each backbone's own
  preprocessing follows: MobileNetV3's built-in Rescaling (include_preprocessing),
  EfficientNet's built-in Rescaling + Normalization, ResNet50's caffe centring
  (`caffe_center`; its BGR channel order is folded into the first convolution's
  kernel when weights are loaded). No Lambda layers: the model deserialises with
  safe_mode and converts with tf2onnx and TFLite INT8.
- The application is always built with weights=None (same layers in Keras 3 and
  tf_keras, and whatever the weights); `load_pretrained` then copies the weights
  from a standalone build that loaded them (Keras' ImageNet file or a local one).
- Every backbone here builds in both worlds with equal weight lists (shapes and
  order); MobileNetV3's layer *names* differ (Keras 3 renamed "Conv/BatchNorm" to
  "conv_bn"; tf_keras builds hard-swish from TFOpLambda layers), which nothing
  relies on: the prune stage's twin gets its weights by order.

No TensorFlow import at module level (the config check imports this module).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tfmlops.config import IMAGENET, ModelSpec
from tfmlops.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class App:
    cls: str  # the keras.applications class
    weights_file: str  # Keras' ImageNet file without the top (its cache name)
    url: str
    md5: str
    kwargs: tuple = ()  # extra constructor arguments


_MOBILENET = "https://storage.googleapis.com/tensorflow/keras-applications/mobilenet_v3/"
APPS = {
    "mobilenet_v3_small": App(
        "MobileNetV3Small", "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5", _MOBILENET,
        "d3e8ec802a04aa4fc771ee12a9a9b836", (("include_preprocessing", True),)),
    "mobilenet_v3_large": App(
        "MobileNetV3Large", "weights_mobilenet_v3_large_224_1.0_float_no_top_v2.h5", _MOBILENET,
        "07fb09a5933dd0c8eaafa16978110389", (("include_preprocessing", True),)),
    "efficientnet_b0": App(
        "EfficientNetB0", "efficientnetb0_notop.h5", "https://storage.googleapis.com/keras-applications/",
        "50bc09e76180e00e4465e1a485ddc09d"),
    "resnet50": App(
        "ResNet50", "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
        "https://storage.googleapis.com/tensorflow/keras-applications/resnet/",
        "4d473c1dd8becc155b73f8504c6f6626"),
}
CAFFE_MEAN_RGB = (123.68, 116.779, 103.939)  # ResNet50's caffe preprocessing, RGB order
IMAGENET_STDDEV_RGB = (0.229, 0.224, 0.225)  # EfficientNet's ImageNet correction
# The layers build_model adds around a backbone: everything else is the backbone's.
OWN_LAYERS = frozenset({"image", "to_pixels", "to_rgb", "caffe_center", "gap", "head_dropout",
                        "head_dense", "logits", "probabilities"})
DOWNLOAD_TIMEOUT_S = 5.0


# ------------------------------------------------------------- weights files

def imagenet_path(backbone: str) -> Path:
    """In Keras' own cache of downloaded weights (keras.utils.get_file's default)."""
    cache = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "models"
    return cache / APPS[backbone].weights_file


def ensure_weights(spec: ModelSpec, backbones=None, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Before any other work: ImageNet weights are in Keras' cache or downloaded now.

    `backbones`: every backbone the stage may build (tune searches several);
    default the spec's own. Offline, one ConfigError line naming the file.
    """
    if spec.backbone_weights != IMAGENET:
        return
    for backbone in sorted(set(backbones or [spec.backbone]) - {"none"}):
        _download(backbone, timeout)


def _download(backbone: str, timeout: float) -> Path:
    app, path = APPS[backbone], imagenet_path(backbone)
    if path.is_file():
        return path
    url = app.url + app.weights_file
    log.info(f"backbone: downloading {url} -> {path}")
    partial = None  # the download's temp file until it is renamed into place
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout) as response, \
                tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
            partial = Path(tmp.name)
            shutil.copyfileobj(response, tmp)
        with open(partial, "rb") as f:  # Keras publishes md5 hashes of its files
            md5 = hashlib.file_digest(f, "md5").hexdigest()
        if md5 != app.md5:
            raise OSError("the downloaded file's md5 does not match Keras' hash")
        os.replace(partial, path)
        partial = None
    # URLError, timeouts and refused connections are OSErrors; a connection dropped
    # mid-body is http.client's IncompleteRead
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"model.backbone_weights: imagenet needs {app.weights_file} ({url}), which is not in "
            f"{path.parent} and could not be downloaded ({reason}); copy it to {path} or set "
            "model.backbone_weights to the path of a local copy") from None
    finally:
        if partial is not None:  # a timeout, a drop or a bad hash: nothing half-written stays
            partial.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------ building

def application(backbone: str, keras, input_tensor=None, input_shape=None, weights=None):
    """The Keras application without its top, in `keras` (Keras 3 or tf_keras)."""
    app = APPS[backbone]
    return getattr(keras.applications, app.cls)(
        include_top=False, weights=weights, input_tensor=input_tensor, input_shape=input_shape,
        **dict(app.kwargs))


def features(spec: ModelSpec, keras, inputs, input_stats):
    """The backbone's feature map for `inputs` (mean/std-normalised floats)."""
    if input_stats is None:
        raise ValueError("build_model: a backbone needs input_stats=(mean, std) of the prepared "
                         "data, to turn the model's input back into pixels")
    layers = keras.layers
    mean, std = (list(map(float, v)) for v in input_stats)
    # x * std + mean undoes the pipeline's normalisation; x 255: pixels, as ImageNet saw them.
    x = layers.Rescaling([255.0 * s for s in std], offset=[255.0 * m for m in mean],
                         name="to_pixels")(inputs)
    if inputs.shape[-1] == 1:
        x = layers.Concatenate(name="to_rgb")([x, x, x])
    if spec.backbone == "resnet50":
        x = layers.Rescaling(1.0, offset=[-m for m in CAFFE_MEAN_RGB], name="caffe_center")(x)
    return application(spec.backbone, keras, input_tensor=x).output


def input_stats_of(model) -> tuple[list[float], list[float]] | None:
    """(mean, std) a built model's `to_pixels` layer undoes; None without a backbone."""
    import numpy as np

    try:
        layer = model.get_layer("to_pixels")
    except ValueError:
        return None
    scale, offset = (np.ravel(np.asarray(v, dtype="float64")) for v in (layer.scale, layer.offset))
    return [float(o) / 255.0 for o in offset], [float(s) / 255.0 for s in scale]


def backbone_layers(model) -> list:
    """The backbone's layers of a model build_model made, bottom to top."""
    return [layer for layer in model.layers if layer.name not in OWN_LAYERS]


def load_pretrained(model, spec: ModelSpec, keras) -> bool:
    """Copy `spec.backbone_weights` into `model`'s backbone; False when there are none.

    A standalone build of the application loads the file exactly as Keras does,
    then its weighted layers are copied in order (the layers in front of the
    backbone have no weights, so file formats that count layers by class still match).
    """
    import numpy as np

    source_name = spec.backbone_weights  # "imagenet" (from Keras' cache) or a file
    if spec.backbone == "none" or source_name is None:
        return False
    if source_name == IMAGENET and not imagenet_path(spec.backbone).is_file():
        raise ConfigError(f"model.backbone_weights: imagenet: {imagenet_path(spec.backbone)} is "
                          "missing; the stage fetches it at its start (ensure_weights)")
    channels_last = tuple(model.input.shape[1:3]) + (3,)
    source = application(spec.backbone, keras, input_shape=channels_last, weights=source_name)
    src = [layer for layer in source.layers if layer.weights]
    dst = [layer for layer in backbone_layers(model) if layer.weights]
    if [len(a.weights) for a in src] != [len(b.weights) for b in dst]:
        raise ValueError(f"{spec.backbone}: the weights file's layers do not match the backbone")
    for a, b in zip(src, dst, strict=True):
        b.set_weights(a.get_weights())
    if spec.backbone == "efficientnet_b0" and source_name == IMAGENET:
        # Keras adds Rescaling(1/sqrt(std)) after the Normalization for ImageNet weights
        # only; folded into the variance, the layers stay those of every other build.
        norm = next(layer for layer in dst if type(layer).__name__ == "Normalization")
        mean, variance, *rest = norm.get_weights()
        stddev = np.asarray(IMAGENET_STDDEV_RGB, dtype=variance.dtype).reshape(variance.shape)
        norm.set_weights([mean, variance * stddev, *rest])
    if spec.backbone == "resnet50" and source_name == IMAGENET:
        # ImageNet's ResNet50 was trained on BGR: flip the first kernel's input channels.
        conv = model.get_layer("conv1_conv")
        kernel, *bias = conv.get_weights()
        conv.set_weights([kernel[:, :, ::-1, :], *bias])
    refresh(model)
    log.info(f"backbone: {spec.backbone} weights loaded from {source_name}")
    return True


def refresh(model) -> None:
    """Normalization layers read their mean/variance variables into tensors once;
    after set_weights they must read them again."""
    for layer in model.layers:
        if type(layer).__name__ == "Normalization" and hasattr(layer, "finalize_state"):
            layer.finalize_state()


# ---------------------------------------------------------------- freezing

def top_count(model, unfreeze: int | float) -> int:
    """How many of the backbone's top layers `unfreeze` (a count or a fraction) means."""
    total = len(backbone_layers(model))
    n = unfreeze if isinstance(unfreeze, int) else round(unfreeze * total)
    return max(0, min(int(n), total))


def set_trainable_top(model, unfreeze: int | float | None) -> int:
    """Freeze the backbone but its top `unfreeze` layers (None: all trainable, BN too).

    BatchNormalization layers stay frozen whenever the backbone is partly frozen: a
    frozen BN layer runs in inference mode in Keras, so pretrained statistics are
    not overwritten by small batches of new data. Returns the trainable layer count.
    """
    layers = backbone_layers(model)
    if unfreeze is None:
        for layer in layers:
            layer.trainable = True
        return len(layers)
    first_trainable = len(layers) - top_count(model, unfreeze)
    for i, layer in enumerate(layers):
        layer.trainable = i >= first_trainable and type(layer).__name__ != "BatchNormalization"
    return sum(1 for layer in layers if layer.trainable)
