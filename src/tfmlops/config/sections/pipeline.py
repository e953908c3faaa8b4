"""pipeline: how the tf.data input pipeline feeds training."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field

from tfmlops.config.sections.base import Section


class AugmentConfig(Section):
    enabled: bool = False
    flip: bool = False  # digits are not mirror-symmetric: off by default
    rotation: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.05  # fraction of a full turn
    zoom: Annotated[float, Meta(ge=0.0, le=0.9)] = 0.1
    translate: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.1


# pipeline settings that change speed, not batches: a backup, a tuner state or a
# cache made with other values of these is still the same
SPEED_ONLY = ("autotune", "cache", "cache_budget_mb")


class PipelineConfig(Section):
    shuffle_buffer: Annotated[int, Meta(ge=1, le=10_000_000)] = 2048
    # Where the decoded split is kept after the first epoch. auto: memory when
    # the train split's decoded float32 images fit cache_budget_mb, else a file
    # under paths.cache; memory | disk | off force one. The old true/false still mean
    # memory/off (YAML reads a bare `off` as false too): _rules turns them into these.
    cache: Literal["auto", "memory", "disk", "off"] | bool = "auto"
    cache_budget_mb: Annotated[int, Meta(ge=0, le=10_000_000)] = 1024
    deterministic: bool = True
    # tf.data's autotuner records every element; once the cache serves the
    # epochs that cost halves steady-state throughput on 2 cores, so parallel
    # stages default to one call per core instead (benchmarks/input_pipeline.py).
    autotune: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def without_speed_settings(self) -> dict[str, Any]:
        """The settings that change which batches a run sees (not how fast it gets them)."""
        return {k: v for k, v in msgspec.to_builtins(self).items() if k not in SPEED_ONLY}

    def _rules(self):
        if isinstance(self.cache, bool):
            msgspec.structs.force_setattr(self, "cache", "memory" if self.cache else "off")
