"""Early stopping of losing trials (`tune.pruning`): keras-tuner 1.4.8 passes nothing
from a running trial to its oracle, so the tuner feeds each epoch's objective here
(its `on_epoch_end`, called by keras-tuner's own Keras callback) and sets
`model.stop_training` when this says the trial is losing.

Two rules, both comparing a trial only with trials that ended before it started, so in one
process (trials run one after another, in the seeded order) two cold searches stop the same
trials at the same epochs and choose the same configuration. A distributed search ends
trials in arrival order: there pruning is off (tuner.build_tuner).

- `median` (as Optuna's MedianPruner): after `warmup_epochs`, a trial whose best objective
  so far is worse than the median of the same figure, at the same epoch, of the earlier
  trials that ran to their end (not stopped here) stops at that epoch's end, once at least
  `min_trials` of them reached that epoch. It judges every epoch but needs `min_trials`
  finished trials first, so the first trials of a search, often the costliest, always run
  whole.
- `halving` (successive halving, as Optuna's SuccessiveHalvingPruner, run synchronously):
  a trial is judged only at rungs, epochs (warmup_epochs + 1) * factor**k, and goes on
  past a rung only while its best so far ranks in the top 1/factor (at least the top one)
  of the earlier trials that reached that rung (stopped ones included: they reached it)
  and itself, once `min_trials` earlier trials reached it. Fewer judgements, each harder.

Under hyperband, the default tuner, neither rule has much to stop: hyperband already
halves by rounds, so only its full-length bracket's trials run long enough to be judged
(a round continuing an earlier trial is not judged: `begin`).
With the random or bayesian oracles every trial runs `max_epochs` and the rules save more
(BENCHMARKS.md, tune pruning).

What the oracle then sees: the trial's score is its best epoch up to the stop, which is
what keras-tuner scores from the History. A score can only be lower than the full run's
(the best so far only grows with epochs), so hyperband's next round, which takes the best
scores of a round, can only rank a stopped trial lower, never above a trial that beats it;
and a stopped trial is never the search's best: at the epoch it stopped, an earlier trial
was ahead of it (above the median, or ranked above it at the rung), and that trial's score
is at least what it had there.

State (`STATE_FILE` beside keras-tuner's oracle.json, written whole with temp + os.replace):
each ended trial's curve and the epoch it was stopped at. It is written before the oracle
ends the trial, and only the trials the oracle lists as ended count: a kill between the two
reruns that trial (keras-tuner retries a trial it finds running), which rewrites its entry.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfmlops.files import write_json

log = logging.getLogger(__name__)

STATE_FILE = "tfmlops_pruner.json"


@dataclass
class Pruner:
    """The median or halving rule over the curves of earlier trials; `rule` off: never
    stops one."""

    rule: str
    warmup_epochs: int
    min_trials: int
    sign: int  # +1: a higher objective is better
    path: Path | None = None  # the state file (None: kept in memory only)
    factor: int = 3  # halving: rungs every factor-fold epochs, the top 1/factor go on
    # trial id -> {"curve": {epoch (0-based, absolute): best so far}, "stopped_at_epoch": n | None}
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)
    _reference: list[dict[int, float]] = field(default_factory=list)
    _curve: dict[int, float] = field(default_factory=dict)
    _stopped_at: int | None = None
    _judged: bool = True

    @property
    def enabled(self) -> bool:
        return self.rule != "off"

    def begin(self, earlier: list[str], continued: bool = False) -> None:
        """A trial starts; `earlier`: the ids of the trials that completed before it.
        `continued`: a hyperband round that continues an earlier trial's weights. It is
        never judged: hyperband itself chose it, and its fresh optimizer restarts the
        learning-rate warm-up, so its first epochs can score below where its weights began,
        against fresh trials that are past theirs. Its curve is kept all the same."""
        self._curve, self._stopped_at, self._judged = {}, None, not continued
        # median: only curves run to their end; halving: every trial that reached the rung
        self._reference = [
            {int(e): v for e, v in self.trials[i]["curve"].items()} for i in earlier
            if i in self.trials
            and (self.rule == "halving" or self.trials[i].get("stopped_at_epoch") is None)]

    def observe(self, epoch: int, value: float | None, last_epoch: int) -> bool:
        """This trial's objective after `epoch` (0-based, absolute) of a fit that ends
        after `last_epoch`: True when it should stop now."""
        if value is None or not math.isfinite(value):
            return False  # TerminateOnNaN's case, not a score
        previous = self._curve.get(epoch - 1)
        best = value if previous is None else (max if self.sign > 0 else min)(previous, value)
        self._curve[epoch] = best
        if (not self.enabled or not self._judged or self._stopped_at is not None
                or epoch < self.warmup_epochs
                or epoch + 1 >= last_epoch):  # the last epoch: stopping saves nothing
            return False
        if self.rule == "halving" and not self.is_rung(epoch):
            return False
        others = [c[epoch] for c in self._reference if epoch in c]
        if len(others) < self.min_trials:
            return False
        bar, why = self._bar(others, best)
        if self.sign * best < self.sign * bar:
            self._stopped_at = epoch + 1
            log.info(f"tune: trial stopped after epoch {epoch + 1}: its best {best:.4f} {why}")
            return True
        return False

    def is_rung(self, epoch: int) -> bool:
        """halving: whether the end of `epoch` (0-based) is a rung, (warmup + 1) * factor**k."""
        rung = self.warmup_epochs + 1
        while rung < epoch + 1:
            rung *= self.factor
        return rung == epoch + 1

    def _bar(self, others: list[float], best: float) -> tuple[float, str]:
        """The figure a trial's best so far must reach to go on, and why one below it stops."""
        if self.rule == "median":
            median = statistics.median(others)
            return median, f"trails the median {median:.4f} of {len(others)} earlier trials"
        ranked = sorted([*others, best], key=lambda v: -self.sign * v)  # best first
        keep = max(len(ranked) // self.factor, 1)
        return ranked[keep - 1], (f"is not among the best {keep} of the {len(ranked)} trials "
                                  f"at this rung (the top 1/{self.factor} go on; the bar "
                                  f"is {ranked[keep - 1]:.4f})")

    @property
    def stopped_at_epoch(self) -> int | None:
        """The 1-based epoch after which the running trial was stopped (None: not)."""
        return self._stopped_at

    def end(self, trial_id: str, completed: bool) -> None:
        """The trial ended: keep its curve (a completed trial) and save, before the
        oracle records the end."""
        if completed:
            self.trials[trial_id] = {"curve": {str(e): v for e, v in self._curve.items()},
                                     "stopped_at_epoch": self._stopped_at}
        else:
            self.trials.pop(trial_id, None)
        if self.path is not None and self.enabled:
            write_json(self.path, {"rule": self.rule, "trials": self.trials})


def load(settings, sign: int, folder: Path | None, enabled: bool = True) -> Pruner:
    """The pruner of the search in `folder` with its saved state (`tune.pruning`
    settings; `enabled` False: off whatever they say)."""
    path = None if folder is None else Path(folder) / STATE_FILE
    pruner = Pruner(settings.rule if enabled else "off", settings.warmup_epochs,
                    settings.min_trials, sign, path, settings.factor)
    pruner.trials = stopped_state(path)
    return pruner


def stopped_state(path: Path | None) -> dict[str, dict[str, Any]]:
    """The saved trials of a state file ({} when there is none)."""
    if path is None or not path.is_file():
        return {}
    return json.loads(path.read_text())["trials"]


def stopped_at(folder: str | Path) -> dict[str, int]:
    """trial id -> the epoch the pruner stopped it at, from a search's folder."""
    return {i: t["stopped_at_epoch"] for i, t in stopped_state(Path(folder) / STATE_FILE).items()
            if t.get("stopped_at_epoch") is not None}
