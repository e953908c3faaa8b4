"""Every shell block of the README and of the docs/ pages runs as written, after the two
set-up commands.

Each ```bash block in README.md and in docs/*.md is preceded by a marker that says how it
is checked:

    <!-- test: run -->            run it in the scratch repo after the pipeline
    <!-- test: server PORT -->    its first command is a server on PORT (a free port
                                  is put in its place): started in the background,
                                  the rest of the block runs once it answers, then
                                  it is stopped
    <!-- test: skip REASON -->    not run here (the set-up commands themselves, a host
                                  that only a team has), with the reason

A block without a marker fails the test, so a new command cannot escape it; nor can a new
page: every docs/*.md must be in PAGES. The blocks run in one scratch repo, in PAGES'
order (the README's first, then each page's), so a state a block leaves is there for the
blocks after it: the README's experiment registers version 2, which its promote and
compare blocks use. They run with the PATH a user has after `./dev pipeline` (the venv not
activated: a block that needs it says `source .venv/bin/activate`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import local_server
from conftest import ROOT, VENV_BIN, dvc, free_port, repo_copy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

MARKER = re.compile(r"<!--\s*test:\s*(run|server\s+\d+|skip\b[^>]*?)\s*-->\s*\n```bash\n(.*?)```",
                    re.S)
FENCE = re.compile(r"```bash\n")


# The pages whose blocks run, in the order they run. Only the README's blocks change what
# later blocks see; of the pages, only scaling.md has a block that runs (`tfmlops doctor`,
# in a temporary folder of its own).
PAGES = ("README.md", "docs/stages.md", "docs/own-images.md", "docs/data-contract.md",
         "docs/promotion.md", "docs/serving.md", "docs/scaling.md", "docs/development.md",
         "docs/layout.md")


def page_blocks(page: str) -> list[tuple[str, str]]:
    """(marker, block text) of every bash block of one page, in order."""
    text = (ROOT / page).read_text()
    found = [(m.group(1).strip(), m.group(2)) for m in MARKER.finditer(text)]
    assert len(found) == len(FENCE.findall(text)), (
        f"every ```bash block in {page} needs a <!-- test: ... --> marker before it")
    return found


def doc_blocks() -> list[tuple[str, str, str]]:
    """(page, marker, block text) of every bash block of README.md, then of each page of
    docs/, in PAGES' order."""
    return [(page, marker, block) for page in PAGES for marker, block in page_blocks(page)]


def user_env() -> dict[str, str]:
    """The environment of a user's shell: the venv NOT on PATH, no tracking URI."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if Path(p).resolve() != VENV_BIN.resolve())
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PATH": path, "DVC_NO_ANALYTICS": "1"}


@pytest.fixture(scope="module")
def repo(pipeline_repo, tmp_path_factory):
    """A copy of the session's scratch repo after `dvc repro`, with the project's venv and
    `dev` in place, as a fresh clone has them after the two set-up commands."""
    repo = repo_copy(pipeline_repo[0], tmp_path_factory.mktemp("readme") / "repo")
    (repo / ".venv").symlink_to(VENV_BIN.parent)
    shutil.copy2(ROOT / "dev", repo / "dev")
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write(".venv\ndev\n")
    return repo


def run_block(block: str, repo: Path, timeout: float = 900,
              page: str = "README.md") -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=repo, env=user_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{page} block exited {proc.returncode}:\n{block}\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


def split_server(block: str) -> tuple[str, str, str]:
    """(leading `source` lines, the server command with its continuation lines, the rest)."""
    lines = block.splitlines(keepends=True)
    start = 0
    while lines[start].startswith("source "):
        start += 1
    end = start
    while lines[end].rstrip().endswith("\\"):
        end += 1
    return "".join(lines[:start]), "".join(lines[start:end + 1]), "".join(lines[end + 1:])


def run_with_server(block: str, port: int, repo: Path, tmp_path: Path, page: str) -> str:
    new_port = free_port()
    prelude, server, rest = split_server(block.replace(str(port), str(new_port)))
    log = tmp_path / f"server-{new_port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", prelude + server], cwd=repo,
                                env=user_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for_port(proc, new_port, log, page)
        return run_block(prelude + rest, repo, page=page).stdout
    finally:
        local_server.stop(proc)  # the whole process group, as the serving tests stop theirs


def wait_for_port(proc: subprocess.Popen, port: int, log: Path, page: str,
                  timeout_s: float = 300) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{page} server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"{page} server did not answer on {port}:\n{log.read_text()[-3000:]}")


def test_every_page_is_listed():
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages == set(PAGES[1:]), "PAGES lists every docs/*.md page, and only those"
    assert PAGES[0] == "README.md"


def test_every_block_is_marked():
    blocks = doc_blocks()  # fails on a page with a block that has no marker
    readme = [m for page, m, _ in blocks if page == "README.md"]
    assert any(m == "run" for m in readme) and any(m.startswith("server") for m in readme)
    for page, marker, _ in blocks:
        if marker.startswith("skip"):
            assert len(marker.split(maxsplit=1)) == 2, f"a skipped block says why ({page})"


def test_dev_pipeline_after_a_run_reruns_nothing(repo):
    # `./dev` reinstalls when its stamp does not match, which would point the shared venv's
    # editable install at the scratch copy: DEV_NO_INSTALL makes it stop instead.
    # promote runs on every repro (always_changed) and does nothing: production has it.
    proc = run_block("DEV_NO_INSTALL=1 ./dev pipeline", repo)
    assert re.findall(r"Running stage '([\w-]+)'", proc.stdout) == ["promote"], proc.stdout
    assert "already holds @production; nothing to do" in proc.stderr + proc.stdout


def health_answer(out: str, repo: Path) -> None:
    assert out.strip() == "OK", out


def prediction_answer(out: str, repo: Path) -> None:
    """The served model's answer for the README's digit image, in the shape the README
    shows, and the answer of @production loaded in this process for the same bytes: the
    label is the model's, not only well formed. (Whether it is "3" depends on the tiny
    model of this repo: the README's figure is for the default params.)"""
    import base64

    import mlflow
    import pandas as pd

    (answer,) = json.loads(out)["predictions"]
    assert answer["label"] == str(answer["label_index"]) and 0 <= answer["label_index"] <= 9
    assert len(answer["probabilities"]) == 10
    assert abs(sum(answer["probabilities"]) - 1.0) < 1e-3
    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/digits-classifier@production")
    image = base64.b64encode((repo / "data/builtin/3/digit_0003.png").read_bytes()).decode()
    expected = pd.DataFrame(model.predict(pd.DataFrame([{"image": image}]))).iloc[0]
    assert answer["label"] == expected["label"]
    pairs = zip(answer["probabilities"], expected["probabilities"], strict=True)
    assert max(abs(a - b) for a, b in pairs) < 1e-5


# What each server block's requests must answer (a block's curl fails on an HTTP error):
# `mlflow ui`; `tfmlops serve`; `mlflow models serve` with the request the block before made.
SERVER_ANSWERS = {5000: health_answer, 5001: prediction_answer, 5002: prediction_answer}


def test_server_blocks_fail_on_an_http_error():
    for page, marker, block in doc_blocks():
        if marker.startswith("server"):
            assert int(marker.split()[1]) in SERVER_ANSWERS, (page, marker)
            assert all("curl -sSf " in line for line in block.splitlines() if "curl" in line)


def test_readme_and_docs_blocks_run_as_written(repo, tmp_path):
    dvc("status", cwd=repo)  # the repo is a real DVC project before the blocks run
    for page, marker, block in doc_blocks():
        if marker == "run":
            run_block(block, repo, page=page)
        elif marker.startswith("server"):
            port = int(marker.split()[1])
            SERVER_ANSWERS[port](run_with_server(block, port, repo, tmp_path, page), repo)
