"""The user's environment does not steer the tests: a cluster, a distributed search,
another Keras backend, hidden GPUs, another MLflow store, a running DVC experiment, an
injected tfmlops fault and a global git config that signs commits are all set here, then
the test setup (conftest) is loaded as pytest loads it, in a process of its own."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

# What a user's shell may hold. The check reads these names, not conftest's own list: a
# name dropped from that list is then a leak this test sees.
USER_ENV = {
    "TF_CONFIG": '{"cluster": {"worker": ["10.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}',
    "KERASTUNER_TUNER_ID": "tuner0", "KERASTUNER_ORACLE_IP": "10.0.0.2",
    "KERASTUNER_ORACLE_PORT": "8000", "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "",
    "TF_USE_LEGACY_KERAS": "1",
    "MLFLOW_TRACKING_URI": "http://10.0.0.3:5000", "MLFLOW_REGISTRY_URI": "http://10.0.0.3:5000",
    "DVC_EXP_NAME": "users-exp", "DVC_ROOT": "/elsewhere", "TFMLOPS_FAULT": "train:after_fit",
    "TFMLOPS_HEARTBEAT_S": "0.1",
}
SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, tempfile
    sys.path.insert(0, "tests")
    import conftest  # what pytest imports first
    names = json.loads(sys.argv[1])
    leaked = {k: os.environ[k] for k in names if k in os.environ}
    repo = tempfile.mkdtemp()
    conftest.git("init", "-q", cwd=repo)
    open(os.path.join(repo, "f"), "w").write("x")
    conftest.git("add", "f", cwd=repo)
    try:  # a commit as the scratch-repo tests make them: the user's config signs it
        conftest.git("commit", "-q", "-m", "one", cwd=repo)
        signed = conftest.git("log", "--format=%G?", cwd=repo).strip()
    except subprocess.CalledProcessError as exc:
        signed = f"commit failed: {exc.stderr}"
    print(json.dumps({"leaked": leaked, "signed": signed}))
""")


def test_the_test_setup_clears_the_users_environment(tmp_path):
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("[commit]\n\tgpgsign = true\n[user]\n\tsigningkey = NOPE\n")
    env = {**os.environ, **USER_ENV, "GIT_CONFIG_GLOBAL": str(gitconfig)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(sorted(USER_ENV))], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"leaked": {}, "signed": "N"}, result


def test_the_suites_own_knobs_are_kept(tmp_path):
    script = "import os, sys; sys.path.insert(0, 'tests'); import conftest; " \
             "print(os.environ.get('TFMLOPS_HYPOTHESIS_LONG'))"
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TFMLOPS_HYPOTHESIS_LONG": "1"}, timeout=120, check=True)
    assert proc.stdout.strip() == "1"
