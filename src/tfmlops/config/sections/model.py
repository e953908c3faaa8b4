"""model: the architecture as data."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text, copies

Backbone = Literal["none", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
                   "resnet50"]
BACKBONES = typing.get_args(Backbone)
IMAGENET = "imagenet"  # model.backbone_weights: Keras' own ImageNet weights


class BlockSpec(Section):
    filters: Annotated[int, Meta(ge=1, le=4096)] = 32
    kernel_size: Annotated[int, Meta(ge=1, le=15)] = 3
    separable: bool = False


class ModelSpec(Section):
    """The architecture as data; `tfmlops.model.builder.build_model` builds it."""

    # Keras applications that build in Keras 3 and tf_keras with equal weight lists
    # (model/backbones.py; prune rebuilds the trained model in tf_keras).
    backbone: Backbone = "none"
    # "imagenet" (Keras' cache, downloaded when online), a local weights file of the
    # backbone without its top (Keras' *_notop.h5 or a saved .weights.h5), or null.
    backbone_weights: Text | None = None
    blocks: list[BlockSpec] = copies(BlockSpec(32, 3, False), BlockSpec(64, 3, False))
    convs_per_block: Annotated[int, Meta(ge=1, le=4)] = 2
    batch_norm: bool = True
    # Keras' default 0.99 averages ~100 steps: too slow for short runs on small
    # data (validation then sees stale statistics and scores near chance).
    bn_momentum: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.9
    dropout: Annotated[float, Meta(ge=0.0, le=0.9)] = 0.25
    pooling: Literal["max", "avg"] = "max"
    head_units: Annotated[int, Meta(ge=0, le=8192)] = 128
    activation: Literal["relu", "relu6", "swish", "gelu", "elu"] = "relu"
    squeeze_excite: bool = False

    def _rules(self):
        # A missing weights file would fail only when the first model is built, minutes into
        # tune. "imagenet" is checked at the start of tune/train (it may need the network).
        path = self.backbone_weights
        if path is not None and path != IMAGENET and not Path(path).is_file():
            raise Rule(f"{{p}}backbone_weights: {path!r} is not a file (relative paths start at "
                       "the project root); give a local weights file, imagenet or null")
        if self.backbone == "none" and not self.blocks:  # a body
            raise Rule("{p}blocks: empty; give at least one block or a backbone")
