"""prune: magnitude pruning's schedule and fine-tuning."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section


class PruneConfig(Section):
    initial_sparsity: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0
    final_sparsity: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.85
    epochs: Annotated[int, Meta(ge=1, le=10_000)] = 20  # fine-tuning epochs
    begin_fraction: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0
    end_fraction: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5  # final sparsity reached here
    frequency: Annotated[int, Meta(ge=1, le=1_000_000)] = 5  # steps between mask updates
    learning_rate: Annotated[float, Meta(gt=0.0, le=10.0)] = 4e-3
    # Fine-tuning ends at the first epoch at full sparsity whose validation accuracy is
    # the trained model's again (as many validation images right): later epochs can only
    # add to a model that already lost nothing there.
    stop_when_recovered: bool = True

    def _rules(self):  # sparsity grows
        if self.final_sparsity < self.initial_sparsity:
            raise Rule(f"{{p}}final_sparsity: {self.final_sparsity} < initial_sparsity "
                       f"{self.initial_sparsity}; final must be >= initial")
        if self.end_fraction <= self.begin_fraction:
            raise Rule(f"{{p}}end_fraction: must be > begin_fraction ({self.begin_fraction})")
