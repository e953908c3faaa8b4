"""The tune stage's final-round choices, on hand-made results (no training)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.config import config_from_dict
from tfmlops.stages.tune import search_space
from tfmlops.stages.tune.final_round import FinalEntry, finalists, pick_winner
from tfmlops.stages.tune.search import TrialRecord

CFG = config_from_dict({"tune": {"space": {"batch_size": [32, 64]}}})


def entry(name, score, val_loss, error=None, val_examples=400):
    return FinalEntry(name, CFG, score=score, val_loss=val_loss, error=error,
                      val_examples=val_examples)


def test_a_challenger_must_beat_the_params_settings_beyond_one_validation_image():
    params = entry("params", 0.99, 0.05)  # 396 of 400 right
    assert pick_winner(CFG, [params, entry("trial-3", 0.99, 0.05)]) is params
    # the same accuracy with a lower val_loss is a tie on the objective: no change
    assert pick_winner(CFG, [params, entry("trial-3", 0.99, 0.01)]) is params
    assert pick_winner(CFG, [params, entry("trial-4", 0.98, 0.01)]) is params
    # one image more right (397/400) is within the noise, even with a lower val_loss
    assert pick_winner(CFG, [params, entry("trial-5", 0.9925, 0.01)]) is params
    # two images more right, but a worse val_loss: no evidence either
    assert pick_winner(CFG, [params, entry("trial-6", 0.995, 0.09)]) is params
    # two images more right and not worse on val_loss: a real gain
    better, same_lower_loss = entry("trial-7", 0.995, 0.05), entry("trial-8", 0.995, 0.02)
    assert pick_winner(CFG, [params, better]) is better
    assert pick_winner(CFG, [params, better, same_lower_loss]) is same_lower_loss


def test_the_noise_margin_is_one_image_of_the_validation_split():
    # 0.9964 vs 0.9929 on 281 images is one image: the case a fresh clone got wrong
    params = entry("params", 279 / 281, 0.030, val_examples=281)
    one_more = entry("trial-1", 280 / 281, 0.028, val_examples=281)
    assert pick_winner(CFG, [params, one_more]) is params
    small_split = [entry("params", 0.90, 0.3, val_examples=20),
                   entry("trial-2", 0.95, 0.3, val_examples=20)]  # one of 20
    assert pick_winner(CFG, small_split) is small_split[0]
    two_of_20 = entry("trial-3", 1.0, 0.2, val_examples=20)
    assert pick_winner(CFG, [small_split[0], two_of_20]) is two_of_20


def test_a_loss_objective_wants_lower():
    cfg = config_from_dict({"tune": {"objective": "val_loss"}})
    params = entry("params", 0.05, 0.05)
    lower = entry("trial-1", 0.04, 0.04)
    assert pick_winner(cfg, [params, lower]) is lower
    assert pick_winner(cfg, [params, entry("trial-2", 0.06, 0.06)]) is params


def test_failed_finalists_are_skipped_and_all_failed_raises():
    failed = entry("params", None, None, error="ResourceExhaustedError: OOM")
    nan = entry("trial-1", math.nan, math.nan)
    ok = entry("trial-2", 0.9, 0.3)
    assert pick_winner(CFG, [failed, nan, ok]) is ok
    with pytest.raises(RuntimeError, match="every finalist failed"):
        pick_winner(CFG, [failed, nan])


def trial(trial_id, score, **values):
    base = search_space.values_from_config(CFG)
    return TrialRecord(str(trial_id), "COMPLETED", score, 1, {**base, **values})


def test_finalists_are_the_best_distinct_trials_other_than_the_params_own():
    own = trial(0, 0.99)  # the baseline trial: the params' own values
    a = trial(1, 0.95, learning_rate=0.004)
    a_continued = trial(4, 0.97, learning_rate=0.004)  # hyperband's next round, same values
    b = trial(2, 0.96, learning_rate=0.001)
    failed = TrialRecord("3", "FAILED", None, None, {"learning_rate": 0.002})
    trials = [own, a, b, failed, a_continued]
    best = a_continued
    assert finalists(CFG, trials, best, 1) == [a_continued]
    # `best` goes first; the params' own 0.99 then takes the second slot, above b
    assert finalists(CFG, trials, best, 2) == [a_continued]
    assert finalists(CFG, trials, best, 5) == [a_continued, b]


def test_a_trial_the_search_ranked_below_the_params_own_is_not_a_finalist():
    """The params' own settings won the search (photos: hyperband's promoted baseline):
    with one slot, nothing else is trained at full length; with two, the runner-up."""
    own = trial(0, 0.90)
    a = trial(1, 0.92, learning_rate=0.004)
    own_continued = trial(3, 0.98)  # hyperband's next round of the baseline
    a_continued = trial(4, 0.97, learning_rate=0.004)
    b = trial(2, 0.95, learning_rate=0.001)
    trials = [own, a, b, own_continued, a_continued]
    assert finalists(CFG, trials, own_continued, 1) == []
    assert finalists(CFG, trials, own_continued, 2) == [a_continued]
    assert finalists(CFG, trials, own_continued, 3) == [a_continued, b]
    # a trial that ties the params' own is not ahead of it (ties keep the params')
    tie = trial(5, 0.98, learning_rate=0.003)
    assert finalists(CFG, [*trials, tie], own_continued, 1) == []


PARAMS_RATE = 0.002  # CFG's own learning rate: a trial at it holds the params' own values
RATES = (PARAMS_RATE, 0.001, 0.003, 0.004)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(RATES), st.integers(0, 20)), min_size=1, max_size=12),
       st.integers(1, 4))
def test_finalists_are_the_distinct_configurations_the_search_ranked_above_the_params_own(
        results, n):
    """Whatever the search's results: no finalist is the params' own or ranked below them,
    none repeats another's values, and every configuration ranked above them within the
    best `n` is one."""
    trials = [trial(i, score / 20, learning_rate=rate) for i, (rate, score) in enumerate(results)]
    best = max(trials, key=lambda t: (t.score, -int(t.trial_id)))  # report.best_trial's rule
    picked = finalists(CFG, trials, best, n)

    def key(t):
        return t.values["learning_rate"]

    assert PARAMS_RATE == search_space.values_from_config(CFG)["learning_rate"]
    # each configuration's place: its best score, ties to the earlier trial; `best` first
    ranked = sorted(trials, key=lambda t: (t is not best, -t.score, int(t.trial_id)))
    order = list(dict.fromkeys(key(t) for t in ranked))
    top = order[:n]
    assert [key(t) for t in picked] == [r for r in top if r != PARAMS_RATE]
    assert len({key(t) for t in picked}) == len(picked) <= n
    for t in picked:  # the trial picked is that configuration's best-ranked one
        assert t is next(r for r in ranked if key(r) == key(t))
