"""The multi-worker route of `train`, checked before any TensorFlow work (no processes started).

The 2-process runs themselves are in tests/distributed/test_multi_worker.py.
"""

from __future__ import annotations

import json

import pytest

from tfmlops.errors import ConfigError

TWO_WORKERS = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                          "task": {"type": "worker", "index": 0}})


def test_train_sends_several_workers_to_tf_keras_which_refuses_lamb(digits_workdir,
                                                                     monkeypatch):
    from tfmlops.stages import train

    cfg = digits_workdir(train={"use_tuned": False, "optimizer": {"name": "lamb"}},
                         tracking={"enabled": False})
    monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
    # Raised by stages/train/fit.set_up before the strategy exists: the Keras 3 path
    # (one worker) trains with Lamb, so this error proves the route was taken.
    with pytest.raises(ConfigError, match=r"train\.optimizer\.name: lamb .* tf_keras"):
        train.run(cfg)


def test_no_backup_means_nothing_to_resume(tmp_path):
    from tfmlops.model.backup import chief_finished_epochs

    assert chief_finished_epochs(tmp_path / "missing") == 0
    (tmp_path / "chief").mkdir()
    assert chief_finished_epochs(tmp_path) == 0
