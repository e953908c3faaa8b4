"""README: `tensorboard --logdir reports/profiles` shows the Profiler traces of the stages'
runs side by side. Two real traces of one stage (the folders `profiling.trace` makes),
a real TensorBoard on 127.0.0.1: its profile plugin is on and lists both runs."""

import os
import signal
import subprocess
import time

import pytest
import requests

from conftest import VENV_BIN, child_env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a server


def test_tensorboard_lists_each_runs_profile(make_cfg, tmp_path):
    import tensorflow as tf

    from tfmlops import profiling

    cfg = make_cfg(profiling={"enabled": True})
    folders = []
    for _ in range(2):
        with profiling.trace(cfg, "prune") as folder:
            for _ in range(3):
                tf.reduce_sum(tf.random.normal((64, 64)) @ tf.random.normal((64, 64)))
        folders.append(folder)
    logdir = profiling.profile_dir(cfg, "prune").parent  # reports/profiles
    port, log = free_port(), tmp_path / "tensorboard.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "tensorboard"), "--logdir", str(logdir),
                                 "--host", "127.0.0.1", "--port", str(port)], env=child_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url, runs = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 180
        while len(runs) < 2:  # the plugin finds the runs after it starts
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (runs, log.read_text()[-3000:])
            try:
                runs = requests.get(f"{url}/data/plugin/profile/runs", timeout=10).json()
            except requests.RequestException:
                pass
            time.sleep(0.5)
        plugins = requests.get(f"{url}/data/plugins_listing", timeout=10).json()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert plugins["profile"]["enabled"]
    assert sorted(run.split("/")[1] for run in runs) == sorted(f.name for f in folders)
    assert all(run.startswith("prune/") for run in runs)
