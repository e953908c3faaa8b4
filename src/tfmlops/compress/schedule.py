"""The pruning schedule's steps, derived from the fine-tuning length in params."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfmlops.config import PruneConfig


@dataclass(frozen=True)
class PruningSteps:
    steps_per_epoch: int
    total_steps: int
    begin_step: int
    end_step: int
    frequency: int


def pruning_steps(p: PruneConfig, train_examples: int, batch_size: int) -> PruningSteps:
    """Begin/end steps of tfmot's PolynomialDecay for `p.epochs` of fine-tuning.

    tfmot counts training steps from 1 and updates the masks only when
    `(step - begin) % frequency == 0` and `step <= end`: an end step that is
    not on that grid stops one update short of `final_sparsity`. So the end
    step is moved down onto the grid, and the frequency is shrunk when the
    pruning window is shorter than one update.
    """
    steps_per_epoch = max(1, math.ceil(train_examples / batch_size))
    total = p.epochs * steps_per_epoch
    begin = min(int(p.begin_fraction * total), total - 1)
    end = max(begin + 1, min(total, round(p.end_fraction * total)))
    frequency = max(1, min(p.frequency, end - begin))
    end = begin + (end - begin) // frequency * frequency
    return PruningSteps(steps_per_epoch, total, begin, end, frequency)
