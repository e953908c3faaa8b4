"""model: the architecture as data."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Bool, Float, Int, Text, copies, section

Backbone = Literal["none", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
                   "resnet50"]
BACKBONES = typing.get_args(Backbone)
IMAGENET = "imagenet"  # model.backbone_weights: Keras' own ImageNet weights


@section
class BlockSpec:
    filters: Int = Field(32, ge=1, le=4096)
    kernel_size: Int = Field(3, ge=1, le=15)
    separable: Bool = False


@section
class ModelSpec:
    """The architecture as data; `tfmlops.model.builder.build_model` builds it."""

    # Keras applications that build in Keras 3 and tf_keras with equal weight lists
    # (model/backbones.py; prune rebuilds the trained model in tf_keras).
    backbone: Backbone = "none"
    # "imagenet" (Keras' cache, downloaded when online), a local weights file of the
    # backbone without its top (Keras' *_notop.h5 or a saved .weights.h5), or null.
    backbone_weights: Text | None = None
    blocks: list[BlockSpec] = copies(BlockSpec(32, 3, False), BlockSpec(64, 3, False))
    convs_per_block: Int = Field(2, ge=1, le=4)
    batch_norm: Bool = True
    # Keras' default 0.99 averages ~100 steps: too slow for short runs on small
    # data (validation then sees stale statistics and scores near chance).
    bn_momentum: Float = Field(0.9, ge=0.0, lt=1.0)
    dropout: Float = Field(0.25, ge=0.0, le=0.9)
    pooling: Literal["max", "avg"] = "max"
    head_units: Int = Field(128, ge=0, le=8192)
    activation: Literal["relu", "relu6", "swish", "gelu", "elu"] = "relu"
    squeeze_excite: Bool = False

    @field_validator("backbone_weights")
    @classmethod
    def _weights_file_exists(cls, path):
        # A missing file would fail only when the first model is built, minutes into
        # tune. "imagenet" is checked at the start of tune/train (it may need the network).
        if path is not None and path != IMAGENET and not Path(path).is_file():
            raise Rule(f"{{path}}: {path!r} is not a file (relative paths start at the "
                       "project root); give a local weights file, imagenet or null")
        return path

    @model_validator(mode="after")
    def _has_a_body(self):
        if self.backbone == "none" and not self.blocks:
            raise Rule("{p}blocks: empty; give at least one block or a backbone")
        return self
