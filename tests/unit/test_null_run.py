"""The run of an untracked stage (materialize): StageRun's methods do nothing, and a
name StageRun does not have fails, as it would on a tracked stage's real run."""

import pytest

from tfmlops.harness import NullRun
from tfmlops.tracking import StageRun


def test_every_stage_run_method_is_a_no_op():
    run = NullRun()
    names = [n for n in dir(StageRun) if not n.startswith("_") and callable(getattr(StageRun, n))]
    assert {"log_metrics", "log_params", "log_artifact", "set_tags", "wait_open"} <= set(names)
    for name in names:
        assert getattr(run, name)("anything", step=1) is None
    assert run.run_id is None and run.active is False


def test_a_misspelled_method_fails_as_on_a_real_run():
    with pytest.raises(AttributeError, match="log_metirc"):
        NullRun().log_metirc({"a": 1})
