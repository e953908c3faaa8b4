"""tune.space -> keras-tuner hyperparameters -> the Config a trial (and train) builds from."""

from __future__ import annotations

import dataclasses

import pytest

from tfmlops.config import Config, config_from_dict
from tfmlops.errors import ConfigError
from tfmlops.model import search_space

kt = pytest.importorskip("keras_tuner")


def space_of(**space):
    return config_from_dict({"tune": {"space": space}}).tune.space


def test_declares_every_key_with_the_params_ranges():
    hp = kt.HyperParameters()
    search_space.declare(hp, Config().tune.space)
    by_name = {p.name: p for p in hp.space}
    assert set(by_name) == set(search_space.HP_NAMES)
    lr = by_name["learning_rate"].get_config()
    assert (lr["min_value"], lr["max_value"], lr["sampling"]) == (5e-4, 5e-3, "log")
    blocks = by_name["blocks"].get_config()
    assert (blocks["min_value"], blocks["max_value"], blocks["step"]) == (1, 3, 1)
    assert by_name["filters"].values == [16, 32]
    assert type(by_name["separable"]).__name__ == "Boolean"  # not Choice([0, 1])
    assert by_name["schedule"].values == ["constant", "cosine_warmup", "exponential_decay"]


def test_schedule_parameters_are_active_only_for_their_schedule():
    space = Config().tune.space
    for schedule, active, inactive in (("cosine_warmup", "warmup_fraction", "decay_rate"),
                                       ("exponential_decay", "decay_rate", "warmup_fraction"),
                                       ("constant", None, "warmup_fraction")):
        hp = kt.HyperParameters()
        search_space.declare(hp, space)
        hp.values["schedule"] = schedule
        hp.ensure_active_values()  # as keras-tuner does when it fills a trial
        values = search_space.declare(hp, space)
        if active:
            assert active in values
        assert inactive not in values


def test_single_values_are_fixed_and_absent_schedules_declare_nothing():
    space = space_of(blocks={"min": 2, "max": 2}, dropout={"min": 0.1, "max": 0.1},
                     filters=[8], schedule=["constant"], separable=[True])
    hp = kt.HyperParameters()
    values = search_space.declare(hp, space)
    fixed = {p.name for p in hp.space if type(p).__name__ == "Fixed"}
    assert {"blocks", "dropout", "filters", "schedule", "separable"} <= fixed
    assert values["blocks"] == 2 and values["separable"] is True
    assert "warmup_fraction" not in {p.name for p in hp.space}


def test_values_become_a_valid_config_with_doubling_widths():
    cfg = Config()
    values = {"blocks": 3, "filters": 16, "separable": 1, "batch_norm": 0, "dropout": 0.3,
              "head_units": 64, "optimizer": "adamw", "learning_rate": 0.0012,
              "schedule": "exponential_decay", "decay_rate": 0.4, "batch_size": 32,
              "tuner/epochs": 2}
    trial = search_space.config_from_values(cfg, values)
    assert [b.filters for b in trial.model.blocks] == [16, 32, 64]
    assert all(b.separable is True for b in trial.model.blocks)  # 0/1 from keras-tuner
    assert trial.model.batch_norm is False and trial.model.dropout == 0.3
    assert trial.model.head_units == 64
    assert trial.train.optimizer.name == "adamw" and trial.train.optimizer.learning_rate == 0.0012
    assert trial.train.schedule.name == "exponential_decay"
    assert trial.train.schedule.decay_rate == 0.4
    assert trial.train.schedule.warmup_fraction == cfg.train.schedule.warmup_fraction
    assert trial.train.batch_size == 32
    # everything not searched keeps the params' value
    assert trial.model.convs_per_block == cfg.model.convs_per_block
    assert trial.train.loss == cfg.train.loss and trial.train.epochs == cfg.train.epochs


def test_sampled_values_always_give_a_valid_config():
    cfg = Config()
    hp = kt.HyperParameters()
    search_space.declare(hp, cfg.tune.space)
    seen = set()
    for seed in range(40):
        sample = kt.HyperParameters()
        for p in hp.space:
            sample.merge([p])
            if sample.is_active(p):
                sample.values[p.name] = p.random_sample(seed * 100 + len(sample.values))
        trial = search_space.config_from_values(cfg, search_space.declare(sample, cfg.tune.space))
        seen.add((len(trial.model.blocks), trial.train.schedule.name))
        assert 5e-4 <= trial.train.optimizer.learning_rate <= 5e-3
    assert len(seen) > 3


@pytest.mark.parametrize("space, image_size, key", [
    ({"blocks": {"min": 1, "max": 6}}, 16, "tune.space.blocks.max"),
    ({"blocks": {"min": 1, "max": 3}, "filters": [2048]}, 32, "tune.space.filters"),
])
def test_architectures_that_cannot_be_built_fail_up_front(space, image_size, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        search_space.check_fits(space_of(**space), image_size)
    search_space.check_fits(Config().tune.space, 8)  # the defaults fit the smallest images


@pytest.mark.parametrize("tuner", ["random", "bayesian", "hyperband"])
def test_same_seed_same_trials(tmp_path, tuner):
    from tfmlops.stages.tune import make_oracle

    def first_trials(seed: int, folder: str):
        cfg = dataclasses.replace(Config(), seed=seed)
        cfg = dataclasses.replace(cfg, tune=dataclasses.replace(cfg.tune, tuner=tuner))
        oracle = make_oracle(cfg)
        oracle._set_project_dir(str(tmp_path), folder)
        hp = kt.HyperParameters()
        search_space.declare(hp, cfg.tune.space)
        oracle.update_space(hp)
        # distinct tuner ids: one id gets its ongoing trial back
        return [oracle.create_trial(f"t{i}").hyperparameters.values for i in range(3)]

    a, b, c = first_trials(7, "a"), first_trials(7, "b"), first_trials(8, "c")
    assert a == b
    assert a != c
    assert len({str(sorted(v.items())) for v in a}) == 3


def test_search_key_ignores_budgets_and_searched_settings_but_not_the_rest():
    from tfmlops.stages.tune import search_key

    cfg = Config()

    def changed(**sections):
        tree = cfg.to_dict()
        for section, values in sections.items():
            tree[section].update(values)
        return config_from_dict(tree)

    key = search_key(cfg)
    assert search_key(changed(tune={"max_trials": 40, "budget_minutes": 9.0})) == key
    assert search_key(changed(train={"batch_size": 128})) == key  # searched: tune.space wins
    assert search_key(changed(model={"dropout": 0.5})) == key
    assert search_key(changed(model={"convs_per_block": 1})) != key  # not searched
    assert search_key(changed(tune={"space": {**cfg.to_dict()["tune"]["space"],
                                              "head_units": [32]}})) != key
    assert search_key(dataclasses.replace(cfg, seed=1)) != key
