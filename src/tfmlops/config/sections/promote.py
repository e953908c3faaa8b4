"""promote: the gate a version passes and how the registry alias moves."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, field

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text


class GateConfig(Section):
    # false: the gate reads only the tags export wrote (no test split needed; the
    # per-class and calibration checks are not applied).
    evaluate: bool = True
    min_accuracy: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.95
    # The non-inferiority margin: promoted automatically only when the paired interval's
    # lower bound is >= -max_regression; refused when the point estimate is below it.
    # At most 0.01: no candidate more than 1 point worse is ever promoted automatically.
    max_regression: Annotated[float, Meta(ge=0.0, le=0.01)] = 0.01
    confidence: Annotated[float, Meta(ge=0.5, lt=1.0)] = 0.95  # of the paired interval
    # Fewer evaluated images than this (after leaving out what either version trained on):
    # inconclusive, never promoted automatically.
    min_images: Annotated[int, Meta(ge=1)] = 100
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
    # required: a candidate that passes the gate waits for `tfmlops approve VERSION`.
    approval: Literal["none", "required"] = "none"
    # Where plain `dvc repro` may move @production; empty: the branch production was first
    # promoted from, or main.
    branches: list[Text] = field(default_factory=list)
    # Removed: a `dvc exp run` never moves @production (its workspace is not committed work).
    from_experiments: bool = False
    # A promotion lock not renewed for this long (its holder died) may be broken.
    lock_lease_s: Annotated[float, Meta(ge=1.0, le=3600.0)] = 60.0

    def _rules(self):
        if self.from_experiments:
            raise Rule("{p}from_experiments: true is no longer accepted: an experiment's "
                       "workspace is not committed work; `dvc exp apply` it, commit, then "
                       "`dvc repro` (or `tfmlops promote --version N`)")
        # MLflow refuses '/' and ':' in a model name, but only when export registers it,
        # after the whole pipeline; a name with both quote kinds cannot be searched for.
        name = self.registered_model
        if "/" in name or ":" in name or ("'" in name and '"' in name):
            raise Rule(f"{{p}}registered_model: {name!r} is not a name MLflow can register and "
                       "search for; leave out '/' and ':' and use one kind of quote at most")
