"""The user's environment does not steer the tests: a cluster, a distributed search,
another Keras backend, hidden GPUs, another MLflow store and a global git config that
signs commits are all set here, then the test setup (conftest) is loaded as pytest loads it."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import LEAKY, ROOT

USER_ENV = {
    "TF_CONFIG": '{"cluster": {"worker": ["10.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}',
    "KERASTUNER_TUNER_ID": "tuner0", "KERASTUNER_ORACLE_IP": "10.0.0.2",
    "KERASTUNER_ORACLE_PORT": "8000", "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "",
    "MLFLOW_TRACKING_URI": "http://10.0.0.3:5000", "MLFLOW_REGISTRY_URI": "http://10.0.0.3:5000",
}


def test_the_test_setup_clears_the_users_environment(tmp_path):
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("[commit]\n\tgpgsign = true\n[user]\n\tsigningkey = NOPE\n")
    script = textwrap.dedent("""
        import json, os, subprocess, sys
        sys.path.insert(0, "tests")
        import conftest  # noqa: F401 - what pytest imports first
        leaked = {k: v for k, v in os.environ.items()
                  if k in conftest.LEAKY or k.startswith(conftest.LEAKY_PREFIXES)}
        sign = subprocess.run(["git", "config", "--get", "commit.gpgsign"],
                              capture_output=True, text=True).stdout.strip()
        print(json.dumps({"leaked": leaked, "gpgsign": sign}))
    """)
    env = {**os.environ, **USER_ENV, "GIT_CONFIG_GLOBAL": str(gitconfig)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"leaked": {}, "gpgsign": ""}, result


def test_a_commit_in_a_scratch_repo_is_not_signed(tmp_path):
    from conftest import git

    git("init", "-q", cwd=tmp_path)
    (tmp_path / "f").write_text("x")
    git("add", "f", cwd=tmp_path)
    git("commit", "-q", "-m", "one", cwd=tmp_path)  # a global gpgsign would fail here
    assert git("log", "--format=%G?", cwd=tmp_path).strip() == "N"
    assert "TF_CONFIG" in LEAKY and not os.environ.get("TF_CONFIG")
