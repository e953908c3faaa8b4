"""promote: the gate a version passes and how the registry alias moves."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, field

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text


class GateConfig(Section):
    # false: the gate reads only the tags export wrote (no test split needed; the
    # per-class and calibration checks are not applied).
    evaluate: bool = True
    min_accuracy: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.95
    max_regression: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.005
    # The paired interval's confidence: a regression refuses only when the whole
    # interval lies below -max_regression.
    confidence: Annotated[float, Meta(ge=0.5, lt=1.0)] = 0.95
    min_class_recall: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.8
    max_class_drop: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.2
    max_ece: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    min_edge_agreement: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.97
    max_size_bytes: Annotated[int, Meta(ge=1)] = 5_000_000
    max_latency_ms: Annotated[float, Meta(gt=0.0)] = 20.0
    require_parity: bool = True


class PromoteConfig(Section):
    registered_model: Text = "digits-classifier"
    gate: GateConfig = field(default_factory=GateConfig)
    fail_pipeline: bool = False
    # A `dvc exp run` is tentative until applied and committed: its version gets
    # @exp-<name>, never @production, unless this is true.
    from_experiments: bool = False
    # A promotion lock not renewed for this long (its holder died) may be broken.
    lock_lease_s: Annotated[float, Meta(ge=1.0, le=3600.0)] = 60.0

    def _rules(self):
        # MLflow refuses '/' and ':' in a model name, but only when export registers it,
        # after the whole pipeline; a name with both quote kinds cannot be searched for.
        name = self.registered_model
        if "/" in name or ":" in name or ("'" in name and '"' in name):
            raise Rule(f"{{p}}registered_model: {name!r} is not a name MLflow can register and "
                       "search for; leave out '/' and ':' and use one kind of quote at most")
