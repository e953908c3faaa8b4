"""params.yaml -> typed, frozen, validated Config; errors are one line, exit 2."""

import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, VENV_BIN, committed_params_text
from tfmlops.config import Config, ConfigError, load_config, replace


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_params_yaml_matches_config_defaults(tmp_path):
    """The committed params.yaml (a `dvc exp run` may have changed the working one)."""
    assert load_config(write(tmp_path, committed_params_text())) == Config()


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.seed = 1


@pytest.mark.parametrize(
    "text, key, hint",
    [
        ("data:\n  imge_size: 32\n", "data.imge_size", "unknown key"),
        ("train:\n  epochs: ten\n", "train.epochs", "expected an integer"),
        ("train:\n  epochs: 0\n", "train.epochs", "[1, 10000]"),
        ("data:\n  split: {val: 0.6, test: 0.1}\n", "data.split.val", "out of range"),
        ("train:\n  precision: float8\n", "train.precision", "'mixed_float16'"),
        ("pipeline:\n  deterministic: 'yes'\n", "pipeline.deterministic", "true or false"),
        ("tune:\n  space: {dropout: {min: 0.5, max: 0.1}}\n", "tune.space.dropout", "min <= max"),
        ("tune:\n  space: {filters: []}\n", "tune.space.filters", "empty"),
        ("tune:\n  space: {schedule: [cosine, constant]}\n", "tune.space.schedule", "'cosine'"),
        ("tune:\n  tuner: grid\n", "tune.tuner", "'hyperband'"),
        ("tune:\n  max_trials: 0\n", "tune.max_trials", "out of range"),
        ("prune:\n  final_sparsity: 1.0\n", "prune.final_sparsity", "1.0)"),
        ("train:\n  reduce_lr_on_plateau: true\n", "train.reduce_lr_on_plateau", "constant"),
        ("tune:\n  pruning: {rule: mean}\n", "tune.pruning.rule", "'median'"),
        ("tune:\n  pruning: {rule: true}\n", "tune.pruning.rule", "give median, halving or off"),
        ("tune:\n  pruning: {warmup_epochs: -1}\n", "tune.pruning.warmup_epochs", "out of range"),
        ("tune:\n  pruning: {min_trials: 0}\n", "tune.pruning.min_trials", "out of range"),
        ("tune:\n  pruning: {patience: 2}\n", "tune.pruning.patience", "unknown key"),
    ],
)
def test_each_kind_of_bad_value_names_the_key(tmp_path, text, key, hint):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    message = str(err.value)
    assert message.startswith(key), message
    assert hint in message
    assert "\n" not in message


def test_partial_params_fill_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  epochs: 3\n"))
    assert cfg.train.epochs == 3 and cfg.train.batch_size == Config().train.batch_size


def test_overrides_use_dotted_keys(tmp_path):
    cfg = load_config(write(tmp_path, "{}\n"), {"train.optimizer.learning_rate": 0.01})
    assert cfg.train.optimizer.learning_rate == 0.01


def test_digest_changes_with_a_value():
    a = Config()
    b = replace(a, seed=7)
    assert a.digest() != b.digest() and a.digest("data") == b.digest("data")


def test_cli_exits_2_with_one_line(tmp_path):
    write(tmp_path, "train:\n  batch_size: -1\n")
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "train"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.batch_size" in lines[0] and "out of range" in lines[0]


def test_cli_bad_yaml_and_missing_file(tmp_path):
    write(tmp_path, "train: [unclosed\n")
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "check"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "--params", "nope.yaml", "check"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope.yaml: file not found" in proc.stderr


def test_help_imports_neither_tensorflow_nor_mlflow():
    code = (
        "import sys\n"
        "from tfmlops.cli import main\n"
        "for argv in (['--help'], ['train', '--help'], ['promote', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0\n"
        "heavy = [m for m in ('tensorflow', 'mlflow', 'keras') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_every_dvc_stage_reads_only_known_params():
    """dvc.yaml params entries must exist in params.yaml (a typo would never rerun)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load(committed_params_text())
    for name, stage in stages.items():
        for key in stage.get("params", []):
            node = params
            for part in key.split("."):
                assert part in node, f"dvc.yaml stage {name}: params key {key} not in params.yaml"
                node = node[part]
