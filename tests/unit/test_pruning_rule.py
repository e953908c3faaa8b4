"""tune.pruning: the median rule over earlier trials' curves, its saved state, its config."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
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


def halving_pruner(tmp_path=None, warmup=1, min_trials=1, factor=3, sign=1):
    return pruning.Pruner("halving", warmup, min_trials, sign,
                          None if tmp_path is None else tmp_path / pruning.STATE_FILE, factor)


def test_halving_judges_only_at_rungs_and_keeps_the_top_third():
    pruner = halving_pruner()  # rungs after epochs 2, 6, 18
    for i, curve in enumerate(([0.2, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7],
                               [0.3, 0.6, 0.7, 0.8, 0.8, 0.8, 0.8])):
        finished(pruner, str(i), curve)
    pruner.begin(["0", "1"])
    assert not pruner.observe(0, 0.01, last_epoch=7)  # epoch 1: not a rung
    assert not pruner.observe(1, 0.6, last_epoch=7)  # rung 2: ties the best of 3 (keep 1)
    assert not pruner.observe(2, 0.1, last_epoch=7)  # epochs 3-5: not rungs
    assert pruner.observe(5, 0.75, last_epoch=7)  # rung 6: 0.75 < 0.8, the top 1 of 3
    assert pruner.stopped_at_epoch == 6


def test_halving_counts_the_trials_it_stopped_at_a_rung_they_reached():
    pruner = halving_pruner(warmup=0, factor=2)  # rungs after epochs 1, 2, 4
    finished(pruner, "0", [0.9, 0.9, 0.9, 0.9, 0.9])
    for trial_id, first, earlier in (("1", 0.5, ["0"]), ("2", 0.4, ["0", "1"])):
        pruner.begin(earlier)
        assert pruner.observe(0, first, last_epoch=5)  # 2 or 3 at the rung, keep the best 1
        pruner.end(trial_id, completed=True)
    pruner.begin(["0", "1", "2"])
    # 4 at rung 1 (two of them stopped there), keep 2: 0.6 is second. Counting only the
    # trials that ran whole, it would be second of 2 and stop.
    assert not pruner.observe(0, 0.6, last_epoch=5)
    assert pruner.observe(1, 0.6, last_epoch=5)  # rung 2: trial 0 alone reached it, 0.6 < 0.9


def test_config_reads_halving_and_its_factor(tmp_path):
    cfg = load_config(write(tmp_path, "tune:\n  pruning: {rule: halving, factor: 4}\n"))
    assert (cfg.tune.pruning.rule, cfg.tune.pruning.factor) == ("halving", 4)
    assert load_config(write(tmp_path, "seed: 1\n")).tune.pruning.factor == 3


def run_search(pruner, curves):
    """Trials one after another, as a single-process search: {trial: stopped_at_epoch}."""
    stops = {}
    for i, curve in enumerate(curves):
        pruner.begin([str(j) for j in range(i)])
        for epoch, value in enumerate(curve):
            if pruner.observe(epoch, value, last_epoch=len(curve)):
                break
        stops[str(i)] = pruner.stopped_at_epoch
        pruner.end(str(i), completed=True)
    return stops


@settings(max_examples=150, deadline=None)
@given(rule=st.sampled_from(["median", "halving"]), warmup=st.integers(0, 2),
       min_trials=st.integers(1, 3), factor=st.integers(2, 4), sign=st.sampled_from([1, -1]),
       curves=st.lists(st.lists(st.floats(0, 1), min_size=1, max_size=7), min_size=1,
                       max_size=8))
def test_a_stopped_trial_was_judged_fairly_never_wins_and_replays_the_same(
        rule, warmup, min_trials, factor, sign, curves):
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / pruning.STATE_FILE
        pruner = pruning.Pruner(rule, warmup, min_trials, sign, state, factor)
        stops = run_search(pruner, curves)
        fresh = pruning.Pruner(rule, warmup, min_trials, sign, None, factor)
        assert run_search(fresh, curves) == stops  # deterministic: a cold rerun stops the same
        assert pruning.stopped_state(state) == pruner.trials  # what a resumed search reloads
    better = max if sign > 0 else min
    scores = {str(i): better(c[:stops[str(i)] or len(c)]) for i, c in enumerate(curves)}
    rungs = {(warmup + 1) * factor ** k for k in range(8)}  # 1-based, from the rule's statement
    for trial, stop in stops.items():
        if stop is None:
            continue
        assert warmup <= stop - 1 < len(curves[int(trial)]) - 1  # judged, not the last epoch
        assert rule == "median" or stop in rungs
        # an earlier trial beat it at that epoch, so it is never the search's best
        assert any(sign * scores[o] > sign * scores[trial] for o in scores if int(o) < int(trial))


def test_load_passes_the_halving_settings(tmp_path):
    pruner = pruning.load(PruningConfig(rule="halving", warmup_epochs=0, min_trials=2, factor=4),
                          -1, tmp_path)
    assert (pruner.rule, pruner.warmup_epochs, pruner.min_trials, pruner.factor, pruner.sign) \
        == ("halving", 0, 2, 4, -1)
    assert [e + 1 for e in range(20) if pruner.is_rung(e)] == [1, 4, 16]


def test_a_continued_hyperband_round_is_never_judged_but_its_curve_counts():
    for pruner in (median_pruner(warmup=0, min_trials=1), halving_pruner(warmup=0)):
        finished(pruner, "0", [0.9, 0.9, 0.9, 0.9])
        pruner.begin(["0"], continued=True)  # epochs 3-4 of an earlier trial's weights
        assert not pruner.observe(2, 0.1, last_epoch=4)  # its warm-up dip: not judged
        assert not pruner.observe(3, 0.1, last_epoch=4)
        pruner.end("1", completed=True)
        assert pruner.trials["1"]["curve"] == {"2": 0.1, "3": 0.1}  # observed, not stopped
        pruner.begin(["0"])  # a fresh trial is judged again
        assert pruner.observe(0, 0.1, last_epoch=4)
