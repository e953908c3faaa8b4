"""Each section's own rules (its validators) and the one-line message of each
kind of validation error; the name lists the other modules read."""

from pathlib import Path

import msgspec
import pytest

from tfmlops.config import (
    HP_NAMES,
    SEARCHED_PARAMS,
    BlockSpec,
    Config,
    ConfigError,
    SearchSpace,
    config_from_dict,
    replace,
)
from tfmlops.config.messages import field_info
from tfmlops.config.sections.quantize import QAT_VARIANT, TFLITE_VARIANTS
from tfmlops.stages.quantize import frontier
from tfmlops.stages.tune import search_space


@pytest.mark.parametrize("raw, message", [
    # SplitConfig: val + test leave a train split
    ({"data": {"split": {"val": 0.5, "test": 0.45}}},
     "data.split.val + data.split.test = 0.95; keep it below 0.9"),
    ({"data": {"split": {"too_few": "ignore"}}},
     "data.split.too_few: 'ignore' is not accepted; use one of 'error', 'warn'"),
    # ServingLimits: one image fits in a request
    ({"export": {"serving": {"max_image_pixels": 5000, "max_request_pixels": 4000}}},
     "export.serving.max_image_pixels 5000 is above export.serving.max_request_pixels 4000; "
     "one image must fit in a request"),
    ({"export": {"serving": {"max_rows": 0}}},
     "export.serving.max_rows: 0 is out of range; accepted: [1, 1000000]"),
    # DataConfig: channels as written (Literal alone takes true and 1.0)
    ({"data": {"channels": True}}, "data.channels: True is not accepted; use one of 1, 3"),
    ({"data": {"channels": 1.0}}, "data.channels: 1.0 is not accepted; use one of 1, 3"),
    # ModelSpec: a body
    ({"model": {"blocks": []}}, "model.blocks: empty; give at least one block or a backbone"),
    # ScheduleConfig: piecewise steps
    ({"train": {"schedule": {"factors": [1.0]}}},
     "train.schedule.factors: needs len(boundaries)+1 = 3 values, got 1"),
    ({"train": {"schedule": {"boundaries": [0.8, 0.5]}}},
     "train.schedule.boundaries: [0.8, 0.5] must be increasing fractions in (0, 1)"),
    # IntRange / FloatRange: ordered, bounded below
    ({"tune": {"space": {"blocks": {"min": 3, "max": 2}}}},
     "tune.space.blocks: min 3 > max 2; give min <= max"),
    ({"tune": {"space": {"blocks": {"min": 0, "max": 2}}}},
     "tune.space.blocks.min: 0 is out of range; accepted: [1, inf]"),
    # SearchSpace: each value once; each range within the key it sets
    ({"tune": {"space": {"optimizer": ["adam", "adam"]}}},
     "tune.space.optimizer: 'adam' is listed twice; list each value once"),
    ({"tune": {"space": {"learning_rate": {"min": 0.0, "max": 0.1}}}},
     "tune.space.learning_rate: [0.0, 0.1] is outside (0.0, 10.0]; narrow the range"),
    ({"tune": {"space": {"dropout": {"min": 0.1, "max": 0.95}}}},
     "tune.space.dropout: [0.1, 0.95] is outside [0.0, 0.9]; narrow the range"),
    ({"tune": {"space": {"filters": [8192]}}},
     "tune.space.filters[0]: 8192 is out of range; accepted: [1, 4096]"),
    # PruneConfig: sparsity grows, the schedule ends after it begins
    ({"prune": {"initial_sparsity": 0.5, "final_sparsity": 0.2}},
     "prune.final_sparsity: 0.2 < initial_sparsity 0.5; final must be >= initial"),
    ({"prune": {"begin_fraction": 0.6}}, "prune.end_fraction: must be > begin_fraction (0.6)"),
])
def test_each_section_rule_names_its_keys(raw, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value) == message


@pytest.mark.parametrize("raw, message", [
    ({"model": {"blocks": [{"kernel": 3}]}},
     "model.blocks[0].kernel: unknown key; accepted keys here: filters, kernel_size, separable"),
    ({"train": {"epochs": 0, "epoch": 3}}, "train.epoch: unknown key"),  # unknown keys first
    ({1: 2}, "1: unknown key"),
    ({"data": 5}, "data: expected a mapping, got 5"),
    ({"model": {"blocks": "x"}}, "model.blocks: expected a list, got 'x'"),
    ({"paths": {"reports": ""}}, "paths.reports: expected a non-empty string, got ''"),
    ({"model": {"backbone_weights": 3}}, "model.backbone_weights: expected a non-empty string"),
    ({"seed": 1.5}, "seed: expected an integer, got 1.5"),
    ({"seed": True}, "seed: expected an integer, got True"),
    ({"train": {"optimizer": {"learning_rate": "0.1"}}},
     "train.optimizer.learning_rate: expected a number, got '0.1'"),
    ({"train": {"optimizer": {"learning_rate": float("inf")}}},
     "train.optimizer.learning_rate: expected a finite number, got inf"),
    ({"promote": {"gate": {"max_size_bytes": 0}}},
     "promote.gate.max_size_bytes: 0 is out of range; accepted: [1, inf]"),
    ({"model": {"bn_momentum": 1.0}}, "model.bn_momentum: 1.0 is out of range; accepted: [0.0, 1.0)"),
    ({"tune": {"space": {"schedule": ["cosine"]}}}, "tune.space.schedule: 'cosine' is not accepted; "
                                                    "use some of 'constant', "),
    ({"tune": {"space": {"head_units": []}}},
     "tune.space.head_units: empty choice list; give at least one value"),
])
def test_each_kind_of_error_is_one_line(raw, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_values_are_taken_as_written():
    cfg = config_from_dict({"train": {"optimizer": {"learning_rate": 1}}})
    assert type(cfg.train.optimizer.learning_rate) is float
    with pytest.raises(ConfigError, match="true or false"):
        config_from_dict({"pipeline": {"deterministic": "yes"}})


def test_replace_revalidates_and_positional_construction_works():
    cfg = Config()
    with pytest.raises(ConfigError, match=r"epochs: 0 is out of range; accepted: \[1, 10000\]"):
        replace(cfg.train, epochs=0)
    assert BlockSpec(8, 3, True) == BlockSpec(filters=8, kernel_size=3, separable=True)
    assert replace(cfg, seed=1).model is cfg.model


def test_searched_names_are_the_search_space_fields_and_set_real_keys():
    assert HP_NAMES == tuple(f.name for f in msgspec.structs.fields(SearchSpace))
    assert search_space.HP_NAMES is HP_NAMES
    assert set(search_space.PARAMS_KEYS) == set(HP_NAMES)
    for key in SEARCHED_PARAMS.values():
        assert field_info(Config, key.split(".")) is not None, key
    assert search_space.MAX_FILTERS == 4096


def test_variant_names_are_one_list():
    assert set(frontier.variants("pruned")) | {"qat_int8"} == set(TFLITE_VARIANTS)
    assert QAT_VARIANT == "pruned_qat_int8"


def test_blocks_too_wide_to_double_are_not_the_searched_shape():
    cfg = config_from_dict({"model": {"blocks": [{"filters": 4096}, {"filters": 4096}]}})
    values, why = search_space.baseline(cfg)
    assert values is None and why.startswith("model.blocks do not double") and "\n" not in why


# ------------------------------------- issue 14.16: what used to fail minutes in

@pytest.mark.parametrize("raw, message", [
    # train.overrides: dotted keys that exist, values their key accepts
    ({"train": {"overrides": {"optimizer.learnig_rate": 0.1}}},
     "train.overrides: 'optimizer.learnig_rate' is not a key of model or train "
     "(did you mean train.optimizer.learning_rate?)"),
    ({"train": {"overrides": {"dropout": 0.1}}},
     "train.overrides: 'dropout' is not a key of model or train (did you mean model.dropout?)"),
    ({"train": {"overrides": {"model.blocks.0.filters": 8}}},
     "train.overrides: 'model.blocks.0.filters' is not a key of model or train"),
    ({"train": {"overrides": {"overrides.x": 1}}},
     "train.overrides: 'overrides.x' is not a key of model or train"),
    ({"train": {"overrides": {"optimizer.learning_rate": "fast"}}},
     "train.overrides: optimizer.learning_rate: 'fast' is not accepted for "
     "train.optimizer.learning_rate"),
    ({"train": {"overrides": {"model.dropout": 2.0}}},
     "train.overrides: model.dropout: 2.0 is not accepted for model.dropout"),
    # optimizer.clipnorm: null or > 0
    ({"train": {"optimizer": {"clipnorm": 0.0}}},
     "train.optimizer.clipnorm: 0.0 is out of range; accepted: (0.0, "),
    ({"train": {"optimizer": {"clipnorm": -1.0}}},
     "train.optimizer.clipnorm: -1.0 is out of range; accepted: (0.0, "),
    # piecewise factors: positive multipliers
    ({"train": {"schedule": {"factors": [1.0, -0.1, 0.01]}}},
     "train.schedule.factors[1]: -0.1 is out of range; accepted: (0.0, "),
    ({"train": {"schedule": {"factors": [1.0, 0.0, 0.01]}}},
     "train.schedule.factors[1]: 0.0 is out of range; accepted: (0.0, "),
    # tune.space: bounded widths, depths and batch sizes
    ({"tune": {"space": {"filters": [4096], "blocks": {"min": 1, "max": 3}}}},
     "tune.space.filters: 4096 doubled over 3 blocks is 16384 filters, above 4096"),
    ({"data": {"image_size": 1024}, "tune": {"space": {"blocks": {"min": 1, "max": 9}}}},
     "tune.space.filters: 32 doubled over 9 blocks is 8192 filters, above 4096"),
    ({"tune": {"space": {"blocks": {"min": 1, "max": 50}}}},
     "tune.space.blocks.max: 50 blocks pool 49 times, more than a 32x32 input allows"),
    ({"tune": {"space": {"blocks": {"min": 1, "max": 10**12}}}},  # ran out of memory on 2**pools
     "tune.space.blocks.max: 1000000000000 blocks pool 999999999999 times, more than a 32x32"),
    ({"tune": {"space": {"blocks": {"min": 1, "max": 7}}}},  # 32 // 2**6 == 0: one too many
     "tune.space.blocks.max: 7 blocks pool 6 times, more than a 32x32 input allows"),
    ({"tune": {"space": {"filters": [10**6]}}}, "tune.space.filters[0]: 1000000 is out of range"),
    ({"tune": {"space": {"head_units": [10**6]}}},
     "tune.space.head_units[0]: 1000000 is out of range"),
    ({"tune": {"space": {"batch_size": [10**9]}}},
     "tune.space.batch_size[0]: 1000000000 is out of range; accepted: [1, 65536]"),
    ({"train": {"batch_size": 10**9}}, "train.batch_size: 1000000000 is out of range"),
    # export.model_name: one folder name
    ({"export": {"model_name": "../elsewhere"}}, "export.model_name: '../elsewhere' is not a plain name"),
    ({"export": {"model_name": "a/b"}}, "export.model_name: 'a/b' is not a plain name"),
    ({"export": {"model_name": "a\\b"}}, "export.model_name: 'a\\\\b' is not a plain name"),
    ({"export": {"model_name": ".."}}, "export.model_name: '..' is not a plain name"),
    # model.backbone_weights: a file that exists
    ({"model": {"backbone": "mobilenet_v3_small", "backbone_weights": "no/such/weights.h5"}},
     "model.backbone_weights: 'no/such/weights.h5' is not a file"),
    # "imagenet" is Keras' own (checked at tune/train's start); a near miss is a file
    ({"model": {"backbone": "mobilenet_v3_small", "backbone_weights": "imagenet1k"}},
     "model.backbone_weights: 'imagenet1k' is not a file"),
    ({"train": {"fine_tune": {"unfreeze": 1.5}}},
     "train.fine_tune.unfreeze: 1.5 is neither a fraction"),
    ({"data": {"image_size": 16}, "tune": {"space": {"backbone": ["none", "resnet50"]}}},
     "tune.space.backbone: resnet50 needs inputs of at least 32x32"),
])
def test_what_used_to_fail_minutes_in_fails_at_the_boundary(raw, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value) and "; " in str(err.value)  # problem; fix


def test_valid_overrides_names_and_weights_pass(tmp_path):
    weights = tmp_path / "backbone.weights.h5"
    weights.write_bytes(b"\0")
    cfg = config_from_dict({
        "train": {"optimizer": {"clipnorm": 1.0}, "overrides": {
            "optimizer.learning_rate": 0.01, "model.dropout": 0.2, "batch_size": 16,
            "train.epochs": 3, "schedule": {"name": "constant"}}},
        "export": {"model_name": "digits-v2.1_b"},
        "model": {"backbone": "mobilenet_v3_small", "backbone_weights": str(weights)},
    })
    assert cfg.train.overrides["model.dropout"] == 0.2 and cfg.train.optimizer.clipnorm == 1.0
    # Keras' own ImageNet weights: fetched (or refused offline) at tune/train's start
    assert config_from_dict({"model": {"backbone": "resnet50", "backbone_weights": "imagenet"}})


def test_check_refuses_an_override_typo_with_exit_2(tmp_path):
    import subprocess

    import yaml

    from conftest import VENV_BIN

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"train": {"overrides": {"optimizer.learnig_rate": 0.001}}}))
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "check"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tfmlops check: error: train.overrides: 'optimizer.learnig_rate'")


# ------------------------------- issue 14.7: overlapping paths would delete data

@pytest.mark.parametrize("raw, message", [
    ({"paths": {"prepared": "data"}}, "paths.prepared: 'data' holds paths.builtin 'data/builtin'"),
    ({"data": {"image_dir": "data/prepared"}},
     "data.image_dir: 'data/prepared' equals paths.prepared 'data/prepared'"),
    ({"data": {"image_dir": "data/prepared/own"}},
     "paths.prepared: 'data/prepared' holds data.image_dir 'data/prepared/own'"),
    ({"data": {"image_dir": "data/builtin/3"}},
     "paths.builtin: 'data/builtin' holds data.image_dir 'data/builtin/3'"),
    ({"data": {"image_dir": "models"}}, "data.image_dir: 'models' holds paths.tuned"),
    ({"paths": {"backup": "models/train"}},
     "paths.backup: 'models/train' equals paths.train 'models/train'"),
    ({"paths": {"backup": "models/train/backup"}},
     "paths.train: 'models/train' holds paths.backup 'models/train/backup'"),
    ({"paths": {"backup": "./models/../models/train"}},  # compared resolved
     "paths.backup: './models/../models/train' equals paths.train 'models/train'"),
    ({"paths": {"reports": "data"}}, "paths.reports: 'data' holds paths.builtin"),
    ({"paths": {"profiles": "reports"}}, "paths.profiles: 'reports' equals paths.reports"),
    ({"paths": {"reports": "reports/profiles/r"}}, "paths.profiles: 'reports/profiles' holds"),
])
def test_overlapping_paths_are_refused(raw, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value).startswith(message), str(err.value)
    assert str(err.value).endswith("its own folder, none inside another")


def test_the_intended_overlaps_pass(tmp_path):
    # image_dir == paths.builtin (the default), profiles inside reports, own images elsewhere
    assert Config().data.image_dir == Config().paths.builtin
    config_from_dict({"data": {"image_dir": "./data/builtin"}})
    config_from_dict({"data": {"image_dir": str(tmp_path / "own")}})
    config_from_dict({"paths": {"reports": "out", "profiles": "out/traces/x"}})


def test_every_stage_refuses_overlap_before_touching_the_images(tmp_path):
    import subprocess

    import yaml

    from conftest import VENV_BIN

    image = tmp_path / "data" / "own" / "0" / "a.png"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"\x89PNG not really")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"data": {"image_dir": "data/own"}, "paths": {"prepared": "data"}}))
    for command in ("check", "prepare"):
        proc = subprocess.run([str(VENV_BIN / "tfmlops"), command], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "paths.prepared: 'data' holds" in line, line
    assert image.read_bytes() == b"\x89PNG not really"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["own"]


# --------------------- paths tfmlops deletes in must never be the project's own

@pytest.mark.parametrize("key", ["cache", "prepare_cache", "backup", "profiles", "prepared", "export"])
@pytest.mark.parametrize("value, why", [
    ("/", "is the filesystem's root"),
    ("~home~", "is the home folder"),
    (".", "is the project's root"),
    (".git", "is the project's .git folder"),
    (".dvc/cache", "is inside the project's .dvc folder"),
    ("src", "is the project's src folder"),
    ("tests/x", "is inside the project's tests folder"),
    ("mlflow.db", "is the MLflow store"),
    ("mlartifacts", "is the MLflow store"),
    ("../{root}", "is the project's root"),
])
def test_paths_on_the_projects_own_folders_are_refused(key, value, why):
    from tfmlops.project import repo_root

    value = value.replace("~home~", str(Path.home())).replace("{root}", repo_root().name)
    with pytest.raises(ConfigError) as err:
        config_from_dict({"paths": {key: value}})
    message = str(err.value)
    assert message.startswith(f"paths.{key}: {value!r} {why}"), message
    assert len(message.splitlines()) == 1


def test_a_path_that_holds_the_mlflow_store_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    with pytest.raises(ConfigError, match="holds the MLflow store"):
        config_from_dict({"tracking": {"uri": uri}, "paths": {"cache": str(tmp_path / "store")}})
    config_from_dict({"tracking": {"uri": uri}, "paths": {"cache": str(tmp_path / "cache")}})


@pytest.mark.parametrize("env, cache, why", [
    ("sqlite:///{tmp}/store/mlflow.db", "{tmp}/store", "holds the MLflow store"),
    ("sqlite:///mlruns/mlflow.db", "mlruns", "holds the MLflow store"),  # the project's
    ("sqlite:///{tmp}/mlflow.db", "{tmp}/mlartifacts/cache", "is inside the MLflow store"),
    ("{tmp}/mlruns", "{tmp}/mlruns", "is the MLflow store"),  # a file store's folder
])
def test_the_store_mlflow_tracking_uri_names_is_protected(tmp_path, monkeypatch, env, cache, why):
    """MLFLOW_TRACKING_URI wins over tracking.uri: its local store is the one in use, so
    it is the one no paths.* folder may be (params' own store is then unused)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env.format(tmp=tmp_path))
    params = {"tracking": {"uri": f"sqlite:///{tmp_path / 'params' / 'mlflow.db'}"},
              "paths": {"cache": cache.format(tmp=tmp_path)}}
    with pytest.raises(ConfigError, match=why):
        config_from_dict(params)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    config_from_dict(params)


def test_check_exits_2_with_one_line_for_a_refused_path(tmp_path, capsys):
    import yaml

    from tfmlops.cli import main

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"paths": {"cache": "src"}}))
    assert main(["--params", str(params), "check"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "paths.cache: 'src' is the project's src folder" in line


def test_default_paths_pass_inside_a_dvc_temp_experiment_copy(tmp_path, monkeypatch):
    """`dvc exp run --temp` runs the stages in <repo>/.dvc/tmp/exps/<copy>: its relative
    paths are the copy's, not the repository's .dvc folder."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    (copy / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(copy)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    config_from_dict({})
    with pytest.raises(ConfigError, match="is the project's src folder"):
        config_from_dict({"paths": {"cache": "src"}})


# ------------------------------------- data.shards and data.workers on this machine

def _with_open_files(soft: int, hard: int, code: str, *args: str):
    """`python -c code args` with RLIMIT_NOFILE set to (soft, hard) before it starts."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([sys.executable, "-c", code, *args], preexec_fn=limit,
                          capture_output=True, text=True, timeout=120)


CHECK = ("import sys; from tfmlops.cli import main; "
         "sys.exit(main(['--params', sys.argv[1], 'check']))")


def test_data_params_a_bigger_machine_takes_pass_check_on_this_one(tmp_path):
    """data.workers 32 (2 x a 16-core machine's cores) and data.shards 1024 (3,136 open
    files): valid on a workstation, so valid here too (2 cores, hard limit 1,024 open
    files: prepare fits them when it runs, test_prepare.py); only the static bounds of
    the schema are refused, in one line."""
    import yaml

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"data": {"workers": 32, "shards": 1024}}))
    proc = _with_open_files(1024, 1024, CHECK, str(params))
    assert proc.returncode == 0, proc.stderr
    params.write_text(yaml.safe_dump({"data": {"workers": 1025}}))
    proc = _with_open_files(1024, 1024, CHECK, str(params))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "data.workers" in line and "1024" in line, line


def test_prepare_raises_its_soft_open_files_limit_to_what_the_shards_need():
    """Soft limit 128, hard 4096: 300 shards need 964 files; the process raises its own
    soft limit (what `ulimit -n` would do), and 300 shards pass the check."""
    code = ("import resource; from tfmlops.config import config_from_dict; "
            "from tfmlops.stages.prepare.machine import allow_open_files; "
            "config_from_dict({'data': {'shards': 300}}); allow_open_files(300); "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE))")
    proc = _with_open_files(128, 4096, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(964, 4096)"
