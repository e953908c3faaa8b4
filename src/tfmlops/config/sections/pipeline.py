"""pipeline: how the tf.data input pipeline feeds training."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, field_validator

from tfmlops.config.sections.base import Bool, Float, Int, section


@section
class AugmentConfig:
    enabled: Bool = False
    flip: Bool = False  # digits are not mirror-symmetric: off by default
    rotation: Float = Field(0.05, ge=0.0, le=0.5)  # fraction of a full turn
    zoom: Float = Field(0.1, ge=0.0, le=0.9)
    translate: Float = Field(0.1, ge=0.0, le=0.5)


# pipeline settings that change speed, not batches: a backup, a tuner state or a
# cache made with other values of these is still the same
SPEED_ONLY = ("autotune", "cache", "cache_budget_mb")


@section
class PipelineConfig:
    shuffle_buffer: Int = Field(2048, ge=1, le=10_000_000)
    # Where the decoded split is kept after the first epoch. auto: memory when
    # the train split's decoded float32 images fit cache_budget_mb, else a file
    # under paths.cache; memory | disk | off force one.
    cache: Literal["auto", "memory", "disk", "off"] = "auto"
    cache_budget_mb: Int = Field(1024, ge=0, le=10_000_000)
    deterministic: Bool = True
    # tf.data's autotuner records every element; once the cache serves the
    # epochs that cost halves steady-state throughput on 2 cores, so parallel
    # stages default to one call per core instead (benchmarks/input_pipeline.py).
    autotune: Bool = False
    augment: AugmentConfig = Field(default_factory=AugmentConfig)

    def without_speed_settings(self) -> dict[str, Any]:
        """The settings that change which batches a run sees (not how fast it gets them)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in SPEED_ONLY}

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_old_spelling(cls, value):
        # The old true/false still mean memory/off (YAML reads a bare `off` as false too).
        return {True: "memory", False: "off"}.get(value, value) if isinstance(value, bool) else value
