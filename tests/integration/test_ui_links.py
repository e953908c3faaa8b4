"""The MLflow UI links the project prints open the training view in a fresh browser.

MLflow 3's UI keeps a GenAI / Model-training switch in the browser's localStorage,
default GenAI: a bare experiment link opens the GenAI overview, where no run is
listed. Each stage logs its run's link and its experiment's with
`?workflowType=machine_learning`; the experiment's is rendered here in headless
Chromium (Debian's `chromium`, .ci/services.sh installs it) with a fresh profile,
and must list the run. The README's link is the same page (experiment 1 of a store).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import child_env, free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # mlflow ui and Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def rendered(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, in a browser that never saw the UI before."""
    proc = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=20000",
         "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None and "CI" not in os.environ,  # CI: fail, do not skip
                    reason="needs Debian's chromium (.ci/services.sh installs it)")
def test_the_logged_experiment_link_opens_the_runs_table(make_cfg, tmp_path, caplog):
    from tfmlops import tracking

    assert CHROMIUM, "chromium is not installed: run .ci/services.sh"
    cfg = make_cfg()
    with caplog.at_level(logging.INFO, logger="tfmlops"):
        with tracking.stage_run(cfg, "train", tmp_path / "out", params={"a": 1}) as run:
            pass
    line = next(r.getMessage() for r in caplog.records if "MLflow run" in r.getMessage())
    name, run_link, experiment_link = re.fullmatch(
        r"train: MLflow run (\S+): (\S+) \(runs table: (\S+)\)", line).groups()
    assert run_link.endswith(f"/runs/{run.run_id}?workflowType=machine_learning")
    assert experiment_link == "http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning"

    port = free_port()
    log = (tmp_path / "ui.log").open("w")
    ui = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri",
                           tracking.tracking_uri(cfg), "--host", "127.0.0.1", "--port", str(port),
                           "--workers", "1"], env=child_env(), stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:  # not up yet, or too slow to answer
                pass
            assert time.monotonic() < deadline and ui.poll() is None, "mlflow ui did not start"
            time.sleep(0.5)
        page = rendered(experiment_link.replace("http://127.0.0.1:5000", base),
                        tmp_path / "profile")
    finally:
        import local_server

        local_server.stop(ui)
    assert name in page, "the runs table is not shown: the UI opened another view"
