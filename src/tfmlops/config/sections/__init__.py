"""The sections of params.yaml as frozen msgspec Structs, one module per section.

Each class owns its keys: their types, their defaults, their numeric ranges
(`Meta` bounds), their choices (`Literal`) and the rules that span several of
its keys (its `_rules`, run by `__post_init__`); `root.Config` holds them all and
the rules across sections. `tfmlops.config.replace` re-validates; assignment
raises AttributeError. Nothing here imports TensorFlow, MLflow or pydantic.
"""

from __future__ import annotations

from tfmlops.config.sections.data import DataConfig, SplitConfig, StoreConfig, SyntheticConfig
from tfmlops.config.sections.export import MODEL_NAME, ExportConfig, ServingLimits, SkewLimits
from tfmlops.config.sections.model import BACKBONES, IMAGENET, BlockSpec, ModelSpec
from tfmlops.config.sections.pipeline import SPEED_ONLY, AugmentConfig, PipelineConfig
from tfmlops.config.sections.promote import GateConfig, PromoteConfig
from tfmlops.config.sections.prune import PruneConfig
from tfmlops.config.sections.quantize import CONVERTED_VARIANTS, TFLITE_VARIANTS, QuantizeConfig
from tfmlops.config.sections.root import Config
from tfmlops.config.sections.shared import PathsConfig, ProfilingConfig, TrackingConfig
from tfmlops.config.sections.train import (
    OPTIMIZERS,
    SCHEDULES,
    FineTuneConfig,
    LossConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    override_key,
)
from tfmlops.config.sections.tune import (
    HP_NAMES,
    SEARCHED_PARAMS,
    FloatRange,
    IntRange,
    SearchSpace,
    TuneConfig,
)

__all__ = [
    "BACKBONES", "CONVERTED_VARIANTS", "HP_NAMES", "IMAGENET", "MODEL_NAME", "OPTIMIZERS",
    "SCHEDULES", "SEARCHED_PARAMS", "SPEED_ONLY", "TFLITE_VARIANTS",
    "AugmentConfig", "BlockSpec", "Config", "DataConfig", "ExportConfig", "FineTuneConfig",
    "FloatRange", "GateConfig", "IntRange", "LossConfig", "ModelSpec", "OptimizerConfig",
    "PathsConfig", "PipelineConfig", "ProfilingConfig", "PromoteConfig", "PruneConfig",
    "QuantizeConfig", "ScheduleConfig", "SearchSpace", "ServingLimits", "SkewLimits",
    "SplitConfig", "StoreConfig", "SyntheticConfig", "TrackingConfig", "TrainConfig",
    "TuneConfig", "override_key",
]
