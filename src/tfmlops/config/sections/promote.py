"""promote: the gate a version passes and how the registry alias moves."""

from __future__ import annotations

from pydantic import Field

from tfmlops.config.sections.base import Bool, Float, Int, Text, section


@section
class GateConfig:
    # false: the gate reads only the tags export wrote (no test split needed; the
    # per-class and calibration checks are not applied).
    evaluate: Bool = True
    min_accuracy: Float = Field(0.95, ge=0.0, le=1.0)
    max_regression: Float = Field(0.005, ge=0.0, le=1.0)
    # The paired interval's confidence: a regression refuses only when the whole
    # interval lies below -max_regression.
    confidence: Float = Field(0.95, ge=0.5, lt=1.0)
    min_class_recall: Float = Field(0.8, ge=0.0, le=1.0)
    max_class_drop: Float = Field(0.2, ge=0.0, le=1.0)
    max_ece: Float = Field(0.1, ge=0.0, le=1.0)
    min_edge_agreement: Float = Field(0.97, ge=0.0, le=1.0)
    max_size_bytes: Int = Field(5_000_000, ge=1)
    max_latency_ms: Float = Field(20.0, gt=0.0)
    require_parity: Bool = True


@section
class PromoteConfig:
    registered_model: Text = "digits-classifier"
    gate: GateConfig = Field(default_factory=GateConfig)
    fail_pipeline: Bool = False
    # A `dvc exp run` is tentative until applied and committed: its version gets
    # @exp-<name>, never @production, unless this is true.
    from_experiments: Bool = False
    # A promotion lock not renewed for this long (its holder died) may be broken.
    lock_lease_s: Float = Field(60.0, ge=1.0, le=3600.0)
