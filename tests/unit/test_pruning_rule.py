"""tune.pruning: the median rule over earlier trials' curves, its saved state, its config."""

from __future__ import annotations

import json

from test_config import write

from tfmlops.config import load_config
from tfmlops.config.sections.tune import PruningConfig
from tfmlops.stages.tune import pruning


def finished(pruner, trial_id: str, values: list[float]) -> None:
    """`trial_id` runs its epochs (never judged as losing) and ends."""
    pruner.begin([])
    for epoch, value in enumerate(values):
        pruner.observe(epoch, value, last_epoch=len(values))
    pruner.end(trial_id, completed=True)


def median_pruner(tmp_path=None, warmup=1, min_trials=3, sign=1):
    return pruning.Pruner("median", warmup, min_trials, sign,
                          None if tmp_path is None else tmp_path / pruning.STATE_FILE)


def test_a_trial_behind_the_median_of_earlier_trials_stops_after_the_warm_up():
    pruner = median_pruner()
    for i, curve in enumerate(([0.2, 0.5, 0.6, 0.7], [0.3, 0.6, 0.7, 0.8], [0.1, 0.4, 0.5, 0.6])):
        finished(pruner, str(i), curve)
    pruner.begin(["0", "1", "2"])
    assert not pruner.observe(0, 0.05, last_epoch=4)  # the warm-up epoch is not judged
    assert not pruner.observe(1, 0.5, last_epoch=4)  # at the median (0.5): kept
    assert pruner.observe(2, 0.55, last_epoch=4)  # best so far 0.55 < median 0.6
    assert pruner.stopped_at_epoch == 3  # 1-based, as best_epoch


def test_best_so_far_is_compared_not_the_last_epoch():
    pruner = median_pruner(warmup=0, min_trials=1)
    finished(pruner, "0", [0.5, 0.5, 0.5])
    pruner.begin(["0"])
    assert not pruner.observe(0, 0.6, last_epoch=3)
    assert not pruner.observe(1, 0.3, last_epoch=3)  # a bad epoch after a good one: 0.6 counts


def test_fewer_earlier_trials_than_min_trials_never_stop_and_the_last_epoch_is_not_judged():
    pruner = median_pruner(warmup=0, min_trials=2)
    finished(pruner, "0", [0.9, 0.9])
    pruner.begin(["0"])
    assert not pruner.observe(0, 0.1, last_epoch=2)  # one earlier trial < min_trials 2
    finished(pruner, "1", [0.9, 0.9])
    pruner.begin(["0", "1"])
    assert not pruner.observe(1, 0.1, last_epoch=2)  # its last epoch: nothing to save


def test_only_the_trials_named_as_earlier_and_not_stopped_count():
    pruner = median_pruner(warmup=0, min_trials=1)
    finished(pruner, "0", [0.9, 0.9, 0.9])
    pruner.begin([])  # "0" did not end before this one (a kill's rerun): not compared
    assert not pruner.observe(0, 0.1, last_epoch=3)
    pruner.begin(["0"])
    assert pruner.observe(0, 0.1, last_epoch=3)
    pruner.end("1", completed=True)
    pruner.begin(["1"])  # a stopped trial is not a reference: its curve is cut short
    assert not pruner.observe(0, 0.05, last_epoch=3)


def test_a_loss_objective_stops_the_higher_curve():
    pruner = median_pruner(warmup=0, min_trials=1, sign=-1)
    finished(pruner, "0", [1.0, 0.5, 0.4])
    pruner.begin(["0"])
    assert not pruner.observe(0, 0.9, last_epoch=3)
    assert pruner.observe(1, 0.8, last_epoch=3)  # min(0.9, 0.8) = 0.8 > 0.5


def test_off_never_stops():
    pruner = pruning.Pruner("off", 0, 1, 1)
    finished(pruner, "0", [0.9, 0.9, 0.9])
    pruner.begin(["0"])
    assert not pruner.observe(0, 0.0, last_epoch=3)


def test_the_state_is_saved_whole_and_reloaded(tmp_path):
    pruner = median_pruner(tmp_path, warmup=0, min_trials=1)
    finished(pruner, "0", [0.9, 0.9, 0.9])
    pruner.begin(["0"])
    assert pruner.observe(0, 0.1, last_epoch=3)
    pruner.end("1", completed=True)
    pruner.begin([])
    pruner.end("2", completed=False)  # a failed trial leaves no curve
    saved = json.loads((tmp_path / pruning.STATE_FILE).read_text())
    assert sorted(saved["trials"]) == ["0", "1"] and not list(tmp_path.glob("*.tmp*"))
    assert pruning.stopped_at(tmp_path) == {"1": 1}

    again = pruning.load(PruningConfig(rule="median", warmup_epochs=0, min_trials=1), 1, tmp_path)
    again.begin(["0"])  # what a search resumed after a kill compares with
    assert again.observe(0, 0.1, last_epoch=3)
    off = pruning.load(PruningConfig(rule="median"), 1, tmp_path, enabled=False)  # distributed
    assert not off.enabled


def test_config_reads_yaml_off_and_the_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "tune:\n  pruning: {rule: off}\n"))  # YAML: false
    assert cfg.tune.pruning.rule == "off"
    default = load_config(write(tmp_path, "seed: 1\n")).tune.pruning
    assert (default.rule, default.warmup_epochs, default.min_trials) == ("median", 1, 3)
