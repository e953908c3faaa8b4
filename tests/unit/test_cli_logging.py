"""The CLI's messages: one-line stage messages on stderr, the JSON result alone on
stdout, `-q`/`-v`, and TensorFlow's start-up noise hidden by default."""

import json
import subprocess
import sys

import pytest
import yaml

from conftest import VENV_BIN, child_env, tiny_params

# What TensorFlow's C++ side prints at start-up on a GPU-less host unless told not to.
TF_NOISE = ("oneDNN", "cuInit", "rebuild TensorFlow with the appropriate compiler flags")


def cli_env() -> dict[str, str]:
    """The user's environment, without the TF_CPP_MIN_LOG_LEVEL the test session exports."""
    return {k: v for k, v in child_env().items()
            if k not in ("TF_CPP_MIN_LOG_LEVEL", "MLFLOW_LOGGING_LEVEL")}


@pytest.fixture
def workdir(tmp_path):
    params = tiny_params(tmp_path, tracking={"enabled": False})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return tmp_path


def tfmlops(*args: str, cwd, check: bool = True) -> subprocess.CompletedProcess:
    """`tfmlops ...` as a user runs it (conftest's run_cli would put the level back)."""
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 or not check, proc.stderr[-3000:]
    return proc


def test_check_prints_its_ok_line_on_stderr(workdir):
    proc = tfmlops("check", cwd=workdir)
    assert proc.stderr == "params.yaml: ok\n"
    assert proc.stdout == ""


def test_quiet_check_prints_nothing(workdir):
    proc = tfmlops("-q", "check", cwd=workdir)
    assert (proc.stdout, proc.stderr) == ("", "")


def test_quiet_still_prints_the_error_line(workdir):
    proc = tfmlops("-q", "--params", "nope.yaml", "check", cwd=workdir, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tfmlops check: error: nope.yaml: file not found")


def test_verbose_check_names_level_and_logger(workdir):
    proc = tfmlops("-v", "check", cwd=workdir)
    assert proc.stderr == "INFO tfmlops.cli: params.yaml: ok\n"


def test_quiet_and_verbose_together_are_refused(workdir):
    proc = tfmlops("-q", "-v", "check", cwd=workdir, check=False)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


@pytest.mark.parametrize("flags, expected, mlflow_level", [
    ([], "3", None), (["-q"], "3", "WARNING"), (["-v"], None, None),
])
def test_tensorflow_log_level_is_set_unless_verbose(flags, expected, mlflow_level):
    """Checked in a fresh interpreter: configure() edits os.environ and global loggers."""
    code = (
        "import logging, os, sys\n"
        "from tfmlops import logs\n"
        "from tfmlops.cli import build_parser\n"
        f"logs.configure(build_parser().parse_args({flags!r} + ['check']).verbosity)\n"
        "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), logging.getLogger('absl').level,\n"
        "      logging.getLogger('tfmlops').level, os.environ.get('MLFLOW_LOGGING_LEVEL'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True,
                          text=True, timeout=60, check=True)
    level, absl, ours, mlflow = proc.stdout.split()
    assert level == str(expected) and mlflow == str(mlflow_level)
    assert int(absl) == (0 if flags == ["-v"] else 40)  # NOTSET: absl left alone under -v
    assert int(ours) == {"-q": 30, "-v": 10}.get(flags[0] if flags else "", 20)


def test_a_user_setting_of_the_tensorflow_log_level_wins():
    code = ("import os\nfrom tfmlops import logs\nlogs.configure()\n"
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**cli_env(), "TF_CPP_MIN_LOG_LEVEL": "1"}, timeout=60, check=True)
    assert proc.stdout.strip() == "1"


def test_a_library_user_sees_the_messages_once_they_configure_logging(workdir, caplog):
    """No handler at import: run(cfg) logs to whatever the caller set up (here caplog)."""
    from tfmlops.config import load_config
    from tfmlops.stages import materialize

    with caplog.at_level("INFO", logger="tfmlops"):
        materialize.run(load_config(workdir / "params.yaml"))
    (record,) = [r for r in caplog.records if r.name == "tfmlops.stages.materialize"]
    assert record.levelname == "INFO" and record.getMessage().startswith("materialize: 1797 digits")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stages_print_one_line_each_and_no_tensorflow_noise(workdir):
    """materialize's one line on stderr (none under -q), its JSON on stdout; prepare with
    profiling on loads no TensorFlow (issue 26), so even the user's TensorFlow level shows
    none of its notices; train (profiling on) without the oneDNN and cuInit notices, which
    TensorFlow prints when the user asks for them."""
    quiet = tfmlops("-q", "materialize", cwd=workdir)
    assert quiet.stderr == "" and json.loads(quiet.stdout)["images"] == 1797
    proc = tfmlops("materialize", cwd=workdir)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("materialize: 1797 digits images in 10 classes -> ")
    assert json.loads(proc.stdout) == {"classes": 10, "images": 1797}

    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["profiling"] = {**params["profiling"], "enabled": True, "start_step": 1, "steps": 1}
    params["train"] = {**params["train"], "use_tuned": False, "epochs": 1}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    loud_env = {**cli_env(), "TF_CPP_MIN_LOG_LEVEL": "0"}
    # The control: TensorFlow prints its notices here when the user's level lets it.
    control = subprocess.run([str(VENV_BIN / "python"), "-c", "import tensorflow"], env=loud_env,
                             capture_output=True, text=True, timeout=300)
    assert any(noise in control.stderr for noise in TF_NOISE), control.stderr[-3000:]
    loud = subprocess.run([str(VENV_BIN / "tfmlops"), "prepare"], cwd=workdir, env=loud_env,
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr[-3000:]
    for noise in TF_NOISE:
        assert noise not in loud.stderr, loud.stderr
    assert json.loads(loud.stdout.strip().splitlines()[-1])["images_good"] == 1797
    proc = tfmlops("train", cwd=workdir)
    for noise in TF_NOISE:
        assert noise not in proc.stderr, proc.stderr
