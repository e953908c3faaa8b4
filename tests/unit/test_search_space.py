"""tune.space -> keras-tuner hyperparameters -> the Config a trial (and train) builds from."""

from __future__ import annotations

import keras_tuner as kt  # a dependency: a failed import fails the suite, never skips it
import pytest

from tfmlops.config import Config, config_from_dict, replace
from tfmlops.errors import ConfigError
from tfmlops.model import hparams
from tfmlops.stages.tune import search_space


def space_of(**space):
    return config_from_dict({"tune": {"space": space}}).tune.space


def test_declares_every_key_with_the_params_ranges():
    hp = kt.HyperParameters()
    search_space.declare(hp, Config().tune.space)
    by_name = {p.name: p for p in hp.space}
    # the transfer-learning keys are searched only when tune.space gives them
    assert set(by_name) == set(search_space.HP_NAMES) - set(search_space.OPTIONAL)
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


def oracle_for(cfg: Config, folder) -> object:
    """tune's oracle for `cfg`, its space declared, its state kept in `folder`."""
    from tfmlops.stages.tune.oracles import make_oracle

    oracle = make_oracle(cfg)
    oracle._set_project_dir(str(folder.parent), folder.name)
    hp = kt.HyperParameters()
    search_space.declare(hp, cfg.tune.space)
    oracle.update_space(hp)
    return oracle


def searched(values: dict) -> dict:
    """A trial's values without keras-tuner's own (`tuner/epochs`...)."""
    return {k: v for k, v in values.items() if k in search_space.HP_NAMES}


def with_tuner(cfg: Config, tuner: str) -> Config:
    return replace(cfg, tune=replace(cfg.tune, tuner=tuner))


@pytest.mark.parametrize("tuner", ["random", "bayesian", "hyperband"])
def test_same_seed_same_trials(tmp_path, tuner):
    def first_trials(seed: int, folder: str):
        cfg = with_tuner(replace(Config(), seed=seed), tuner)
        oracle = oracle_for(cfg, tmp_path / folder)
        # distinct tuner ids: one id gets its ongoing trial back
        return [oracle.create_trial(f"t{i}").hyperparameters.values for i in range(3)]

    a, b, c = first_trials(7, "a"), first_trials(7, "b"), first_trials(8, "c")
    assert a == b
    assert a != c
    assert len({str(sorted(v.items())) for v in a}) == 3


def test_search_key_ignores_budgets_and_searched_settings_but_not_the_rest():
    from tfmlops.stages.tune.search import search_key

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
    assert search_key(replace(cfg, seed=1)) != key
    pruning = cfg.to_dict()["tune"]["pruning"]
    # halving's factor is read only by halving: a median search keeps its key (and resumes)
    assert search_key(changed(tune={"pruning": {**pruning, "factor": 4}})) == key
    halving = search_key(changed(tune={"pruning": {**pruning, "rule": "halving"}}))
    assert halving != key
    assert search_key(changed(tune={"pruning": {**pruning, "rule": "halving", "factor": 4}})) \
        != halving


def test_a_changed_dataset_starts_a_fresh_search(tmp_path):
    """docs/stages.md: a changed dataset starts a fresh search. The key follows the bytes of
    prepare's manifest (which lists every image's sha256), not the folder's name."""
    from tfmlops.artifacts import MANIFEST
    from tfmlops.stages.tune.search import search_key

    cfg = Config()
    cfg = replace(cfg, paths=replace(cfg.paths, prepared=str(tmp_path)))
    (tmp_path / MANIFEST).write_text('{"files": [{"sha256": "aa"}]}')
    key = search_key(cfg)
    (tmp_path / MANIFEST).write_text('{"files": [{"sha256": "ab"}]}')  # one image changed
    assert search_key(cfg) != key
    (tmp_path / MANIFEST).write_text('{"files": [{"sha256": "aa"}]}')  # and back
    assert search_key(cfg) == key


# ------------------------------------------------------------- the baseline trial

SEARCHED_VARIANTS = [  # differ from the defaults only in searched settings
    {},
    {"model": {"blocks": [{"filters": 16, "kernel_size": 5, "separable": True}] * 1,
               "batch_norm": False, "dropout": 0.0, "head_units": 64},
     "train": {"batch_size": 32, "optimizer": {"name": "adamw", "learning_rate": 0.0005},
               "schedule": {"name": "exponential_decay", "decay_rate": 0.3}}},
    {"model": {"blocks": [{"filters": 16, "kernel_size": 3, "separable": False},
                          {"filters": 32, "kernel_size": 3, "separable": False},
                          {"filters": 64, "kernel_size": 3, "separable": False}]},
     "train": {"schedule": {"name": "constant"}}},
]


@pytest.mark.parametrize("params", SEARCHED_VARIANTS)
def test_values_from_config_is_the_inverse_of_config_from_values(params):
    cfg = config_from_dict(params)
    values = search_space.values_from_config(cfg)
    back = search_space.config_from_values(cfg, values)
    assert back.model == cfg.model
    assert hparams.tuned_tree(back) == hparams.tuned_tree(cfg)
    # the values alone carry the searched settings (not the base they are applied to)
    other = config_from_dict({"model": {"blocks": [{"filters": 8, "kernel_size": 3}],
                                        "dropout": 0.6},
                              "train": {"batch_size": 16, "optimizer": {"name": "sgd"}}})
    onto_other = search_space.config_from_values(other, values)
    assert [(b.filters, b.separable) for b in onto_other.model.blocks] == [
        (b.filters, b.separable) for b in cfg.model.blocks]
    assert onto_other.model.dropout == cfg.model.dropout
    assert onto_other.train.optimizer.name == cfg.train.optimizer.name
    assert onto_other.train.batch_size == cfg.train.batch_size
    assert onto_other.train.schedule.name == cfg.train.schedule.name
    # only the active schedule parameter, as `declare` gives it
    active = {"cosine_warmup": {"warmup_fraction"}, "exponential_decay": {"decay_rate"}}
    assert set(values) & set(search_space.SCHEDULE_PARAMS) == active.get(
        cfg.train.schedule.name, set())


@pytest.mark.parametrize("blocks", [
    [{"filters": 32}, {"filters": 32}],  # not doubling
    [{"filters": 16, "kernel_size": 3}, {"filters": 32, "kernel_size": 5}],
    [{"filters": 16, "separable": True}, {"filters": 32, "separable": False}],
])
def test_values_from_config_rejects_blocks_the_space_cannot_express(blocks):
    cfg = config_from_dict({"model": {"blocks": blocks}})
    with pytest.raises(ValueError, match="model.blocks"):
        search_space.values_from_config(cfg)
    assert search_space.baseline(cfg)[0] is None


@pytest.mark.parametrize("params, key", [
    ({"train": {"batch_size": 128}}, "train.batch_size 128 is outside tune.space.batch_size"),
    ({"model": {"dropout": 0.5}}, "model.dropout 0.5 is outside tune.space.dropout"),
    ({"train": {"optimizer": {"name": "sgd"}}}, "train.optimizer.name 'sgd' is outside"),
    ({"train": {"schedule": {"name": "cosine_warmup", "warmup_fraction": 0.3}}},
     "train.schedule.warmup_fraction 0.3 is outside"),
    ({"tune": {"space": {"blocks": {"min": 1, "max": 3, "step": 2}}}},
     "model.blocks (count) 2 is outside tune.space.blocks 1..3 step 2"),
    ({"model": {"blocks": [{"filters": 8}]}}, "model.blocks[0].filters 8 is outside"),
])
def test_baseline_names_the_key_outside_the_space(params, key):
    values, why = search_space.baseline(config_from_dict(params))
    assert values is None
    assert why.startswith(key) and "\n" not in why
    # an inactive schedule parameter out of range does not matter
    assert search_space.baseline(config_from_dict(
        {"train": {"schedule": {"name": "cosine_warmup", "decay_rate": 0.99}}}))[1] is None


@pytest.mark.parametrize("tuner", ["random", "bayesian", "hyperband"])
def test_the_first_trial_is_the_params_own_settings(tmp_path, tuner, caplog):
    caplog.set_level("INFO", logger="tfmlops")
    cfg = with_tuner(Config(), tuner)
    base = search_space.values_from_config(cfg)
    oracle = oracle_for(cfg, tmp_path / "s")
    first, second = (oracle.create_trial(f"t{i}") for i in range(2))
    assert searched(first.hyperparameters.values) == base
    assert search_space.is_baseline(first.trial_id, first.hyperparameters.values, base)
    assert searched(second.hyperparameters.values) != base
    assert not search_space.is_baseline(second.trial_id, second.hyperparameters.values, base)
    if tuner == "hyperband":  # the first round of the first bracket
        assert first.hyperparameters.values["tuner/round"] == 0
    lines = [m for m in caplog.messages if "baseline" in m]
    assert lines == ["tune: trial 0 is the baseline: the params' own settings"]


@pytest.mark.parametrize("tuner", ["random", "hyperband"])
def test_a_value_outside_the_space_skips_the_baseline_with_one_line(tmp_path, tuner, caplog):
    caplog.set_level("INFO", logger="tfmlops")
    cfg = with_tuner(config_from_dict({"train": {"batch_size": 128}}), tuner)
    oracle = oracle_for(cfg, tmp_path / "s")
    trials = [oracle.create_trial(f"t{i}") for i in range(2)]
    inside = replace(cfg, train=replace(cfg.train, batch_size=64))
    assert all(searched(t.hyperparameters.values) != search_space.values_from_config(inside)
               for t in trials)
    lines = [m for m in caplog.messages if "baseline" in m]
    assert lines == ["tune: no baseline trial: train.batch_size 128 is outside "
                     "tune.space.batch_size [32, 64]"]


def test_a_resumed_search_does_not_add_the_baseline_again(tmp_path):
    cfg = with_tuner(Config(), "random")
    base = search_space.values_from_config(cfg)
    oracle = oracle_for(cfg, tmp_path / "s")
    for i in range(2):
        trial = oracle.create_trial(f"t{i}")
        oracle.update_trial(trial.trial_id, {"val_accuracy": 0.5})
        trial.status = "COMPLETED"
        oracle.end_trial(trial)
    oracle.save()  # end_trial saves before it drops the ongoing trial

    resumed = oracle_for(cfg, tmp_path / "s")
    resumed.reload()  # as keras-tuner does when the project folder exists
    new = resumed.create_trial("t9")
    assert int(new.trial_id) == 2
    assert [searched(t.hyperparameters.values) == base
            for t in sorted(resumed.trials.values(), key=lambda t: t.trial_id)] == [
        True, False, False]


def test_backbone_and_fine_tune_settings_are_searched_when_given():
    cfg = config_from_dict({
        "model": {"backbone": "mobilenet_v3_small"},
        "train": {"fine_tune": {"unfreeze": 20, "head_epochs": 2, "lr_factor": 0.1}},
        "tune": {"space": {"backbone": ["mobilenet_v3_small", "efficientnet_b0"],
                           "head_epochs": {"min": 1, "max": 3},
                           "unfreeze": {"min": 0.1, "max": 0.5},
                           "lr_factor": {"min": 0.01, "max": 0.5}}}})
    hp = kt.HyperParameters()
    values = search_space.declare(hp, cfg.tune.space)
    by_name = {p.name: p for p in hp.space}
    assert by_name["backbone"].values == ["mobilenet_v3_small", "efficientnet_b0"]
    assert by_name["lr_factor"].get_config()["sampling"] == "log"
    trial = search_space.config_from_values(
        cfg, {**values, "backbone": "efficientnet_b0", "unfreeze": 0.3, "head_epochs": 3})
    assert trial.model.backbone == "efficientnet_b0"
    # the params' unfreeze is a layer count; the searched one a fraction, kept as a float
    assert trial.train.fine_tune.unfreeze == 0.3 and trial.train.fine_tune.head_epochs == 3
    # the params' unfreeze (20 layers) is outside the searched fractions: no baseline, and why
    assert search_space.baseline(cfg) == (
        None, "train.fine_tune.unfreeze 20 is outside tune.space.unfreeze [0.1, 0.5]")
    # a fraction inside it: the baseline trial holds the params' own backbone and fine-tuning
    inside = replace(cfg, train=replace(
        cfg.train, fine_tune=replace(cfg.train.fine_tune, unfreeze=0.3)))
    base, why = search_space.baseline(inside)
    assert why is None
    assert {k: base[k] for k in ("backbone", "head_epochs", "unfreeze", "lr_factor")} == {
        "backbone": "mobilenet_v3_small", "head_epochs": 2, "unfreeze": 0.3, "lr_factor": 0.1}
    merged, _ = hparams.merge(cfg, hparams.tuned_tree(trial))
    assert merged.train.fine_tune.unfreeze == 0.3 and merged.model.backbone == "efficientnet_b0"
    with pytest.raises(ConfigError, match="backbone"):
        config_from_dict({"tune": {"space": {"backbone": ["vgg16"]}}})
