"""prune: magnitude pruning's schedule and fine-tuning."""

from __future__ import annotations

from pydantic import Field, model_validator

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Float, Int, section


@section
class PruneConfig:
    initial_sparsity: Float = Field(0.0, ge=0.0, lt=1.0)
    final_sparsity: Float = Field(0.85, ge=0.0, lt=1.0)
    epochs: Int = Field(30, ge=1, le=10_000)  # fine-tuning epochs
    begin_fraction: Float = Field(0.0, ge=0.0, lt=1.0)
    end_fraction: Float = Field(0.5, gt=0.0, le=1.0)  # final sparsity reached here
    frequency: Int = Field(5, ge=1, le=1_000_000)  # steps between mask updates
    learning_rate: Float = Field(1e-3, gt=0.0, le=10.0)

    @model_validator(mode="after")
    def _sparsity_grows(self):
        if self.final_sparsity < self.initial_sparsity:
            raise Rule(f"{{p}}final_sparsity: {self.final_sparsity} < initial_sparsity "
                       f"{self.initial_sparsity}; final must be >= initial")
        if self.end_fraction <= self.begin_fraction:
            raise Rule(f"{{p}}end_fraction: must be > begin_fraction ({self.begin_fraction})")
        return self
