"""The stage harness (harness.py), through real `tfmlops` processes: SIGTERM of a stage
that keeps its run in its own process, and two runs of one stage at once outside DVC.

`tune` with `tune.enabled: false` is the cheapest stage with an output folder and an
MLflow run: the lifecycle under test is the same code for every stage."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import VENV_BIN, child_env, stage_runs
from tfmlops.artifacts import RUN_FILE

pytestmark = [pytest.mark.timeout(600)]

TEMP_MARKS = (".partial", ".tmp", ".old")


def _untuned(make_cfg):
    return make_cfg(tune={"enabled": False})


def _tune(cwd: Path, log: Path, **env) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen([str(VENV_BIN / "tfmlops"), "tune"], cwd=cwd, stdout=out,
                            stderr=out, env={**child_env(), **env})


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if any(m in p.name for m in TEMP_MARKS))


def test_sigterm_inside_an_in_process_run_ends_it_killed_and_keeps_the_old_output(
        tmp_path, make_cfg):
    cfg = _untuned(make_cfg)
    first = _tune(tmp_path, tmp_path / "first.log")
    assert first.wait(300) == 0, (tmp_path / "first.log").read_text()[-2000:]
    before = json.loads((Path(cfg.paths.tuned) / RUN_FILE).read_text())["run_id"]

    log = tmp_path / "stopped.log"
    proc = _tune(tmp_path, log, TFMLOPS_FAULT="tune.running", TFMLOPS_FAULT_SIGNAL="SIGTERM")
    assert proc.wait(300) == 128 + signal.SIGTERM, log.read_text()[-2000:]
    text = log.read_text()
    assert "Traceback" not in text, text[-2000:]
    last = text.strip().splitlines()[-1]
    assert "tune: stopped by SIGTERM" in last and "KILLED" in last, last
    assert sorted(r.info.status for r in stage_runs(cfg, "tune")) == ["FINISHED", "KILLED"]
    # the output of the first run, whole; nothing staged or half-written left beside it
    assert json.loads((Path(cfg.paths.tuned) / RUN_FILE).read_text())["run_id"] == before
    assert _leftovers(tmp_path / "models") == [] and _leftovers(tmp_path / "reports") == []


def test_two_runs_of_one_stage_take_turns_and_the_output_is_one_runs(tmp_path, make_cfg):
    """The first holds the output lock (stopped inside its run); the second says in one
    line that it waits, and goes on only once the first has swapped its output in."""
    cfg = _untuned(make_cfg)
    first = _tune(tmp_path, tmp_path / "first.log", TFMLOPS_FAULT="tune.running",
                  TFMLOPS_FAULT_SIGNAL="SIGSTOP")
    deadline = time.monotonic() + 240
    while not [r for r in stage_runs(cfg, "tune") if r.info.status == "RUNNING"]:
        assert first.poll() is None and time.monotonic() < deadline, \
            (tmp_path / "first.log").read_text()[-2000:]
        time.sleep(0.5)
    second = _tune(tmp_path, tmp_path / "second.log")
    waited = tmp_path / "second.log"
    while "waiting for it to finish" not in waited.read_text():
        assert second.poll() is None and time.monotonic() < deadline, waited.read_text()[-2000:]
        time.sleep(0.5)
    time.sleep(2)  # it stays blocked: one run in the store, the output not there
    assert second.poll() is None
    assert len(stage_runs(cfg, "tune")) == 1
    assert not (Path(cfg.paths.tuned) / RUN_FILE).exists()
    waiting = [ln for ln in waited.read_text().splitlines() if "waiting" in ln]
    assert len(waiting) == 1 and "another `tfmlops tune` is writing" in waiting[0], waiting

    first.send_signal(signal.SIGCONT)
    assert first.wait(300) == 0, (tmp_path / "first.log").read_text()[-2000:]
    assert second.wait(300) == 0, waited.read_text()[-2000:]
    runs = sorted(stage_runs(cfg, "tune"), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    assert runs[0].info.end_time <= runs[1].info.start_time  # one after the other
    # the folder in place is the second run's, whole
    assert json.loads((Path(cfg.paths.tuned) / RUN_FILE).read_text())["run_id"] == \
        runs[1].info.run_id
    assert _leftovers(tmp_path / "models") == []


def test_a_stage_that_skips_opens_no_run_keeps_its_output_and_rewrites_only_a_new_report(
        tmp_path, make_cfg):
    """`Stage.skip` (promote's already-decided answers): no run, the output as it was, no
    staging left, and reports/<stage>.json and its headline, reports/metrics/<stage>.json,
    rewritten only when they say something new."""
    from tfmlops import harness
    from tfmlops.artifacts import headline_path, report_path
    from tfmlops.stage_spec import StageSpec

    cfg = _untuned(make_cfg)
    spec = StageSpec(name="tune", help="", output="tuned", headline=("outcome",))
    old = Path(cfg.paths.tuned)
    old.mkdir(parents=True)
    (old / "kept.txt").write_text("the last run's")
    report, headline = report_path(cfg.paths.reports, "tune"), headline_path(cfg.paths.reports, "tune")

    def skip(metrics):
        with harness.stage(cfg, spec) as st:
            st.skip(metrics)

    skip({"outcome": "skipped", "time": "t1"})
    assert json.loads(report.read_text()) == {"outcome": "skipped", "time": "t1"}
    assert json.loads(headline.read_text()) == {"outcome": "skipped"}
    assert stage_runs(cfg, "tune") == []
    assert sorted(p.name for p in old.iterdir()) == ["kept.txt"]
    assert _leftovers(tmp_path / "models") == []
    written = report.stat().st_mtime_ns, headline.stat().st_mtime_ns
    time.sleep(0.01)
    skip({"outcome": "skipped", "time": "t2"})  # the same answer at another time
    assert (report.stat().st_mtime_ns, headline.stat().st_mtime_ns) == written
    assert "t1" in report.read_text()
    skip({"outcome": "other", "time": "t3"})
    assert json.loads(report.read_text()) == {"outcome": "other", "time": "t3"}
    assert json.loads(headline.read_text()) == {"outcome": "other"}

    with pytest.raises(RuntimeError, match="skip after its run was opened"):
        with harness.stage(cfg, spec) as st:
            st.run.log_metrics({"x": 1.0})
            st.skip({"outcome": "late"})
    assert [r.info.status for r in stage_runs(cfg, "tune")] == ["FAILED"]
    assert (old / "kept.txt").read_text() == "the last run's"
