"""`kill -9` of `tfmlops prepare` anywhere, then `prepare` again: the output is a cold
run's, and no temp file or pool worker is left. Each named point of
`tfmlops.faults` kills a real `tfmlops prepare` there (SIGKILL, from itself or,
for `decode.worker`, from one of its pool workers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
from test_prepare_trust import age, assert_rows_match_files, prepared_bytes, trust_cfg

from conftest import VENV_BIN
from images import photo_folder
from tfmlops.artifacts import QUARANTINE
from tfmlops.faults import POINTS, STAGE_POINTS
from tfmlops.stages import prepare

TEMP_MARKS = (".partial", ".tmp", "-journal", ".old", ".compact.tmp")


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A folder prepared once (the warm template), then changed: a file gone (a dead
    cache entry, so compaction runs), two new ones (decoded by a pool of two), a bad
    one (quarantined); and a cold run of the changed folder to compare with."""
    import yaml

    from tfmlops.config import load_config

    root = tmp_path_factory.mktemp("kill")

    def make_cfg(work: Path, **sections):
        params = tiny_params_for(work, **sections)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        return load_config(work / "params.yaml")

    files = photo_folder(root / "photos", per_class=4, classes=2)
    age(root / "photos")
    template = trust_cfg(make_cfg, root / "template", root / "photos", workers=2)
    prepare.run(template)
    files[1].unlink()
    for i, f in enumerate(files[2:4]):
        shutil.copy(f, root / "photos" / "c1" / f"new{i}.jpg")
        data = bytearray((root / "photos" / "c1" / f"new{i}.jpg").read_bytes())
        data[-3] ^= 0x01  # new content
        (root / "photos" / "c1" / f"new{i}.jpg").write_bytes(bytes(data))
    (root / "photos" / "c0" / "broken.png").write_bytes(b"not an image")
    age(root / "photos")
    cold = trust_cfg(make_cfg, root / "cold", root / "photos", workers=1, max_bad_fraction=0.2)
    prepare.run(cold)
    return root, make_cfg, prepared_bytes(cold)


def tiny_params_for(work: Path, **sections):
    from conftest import tiny_params

    work.mkdir(parents=True, exist_ok=True)
    return tiny_params(work, **sections)


def _stopped_at(scene, point: str, how: str):
    """A copy of the warm template, `tfmlops prepare` stopped at `point` by the signal
    `how` (TFMLOPS_FAULT_SIGNAL): (cfg, work folder, its exit code, its log's end, the
    tag its processes carry)."""
    root, make_cfg, _ = scene
    work = root / f"{point}-{how}"
    shutil.copytree(root / "template", work)
    cfg = trust_cfg(make_cfg, work, root / "photos", workers=2, max_bad_fraction=0.2)
    tag = uuid.uuid4().hex
    env = {**os.environ, "TFMLOPS_FAULT": point, "TFMLOPS_FAULT_SIGNAL": how,
           "TFMLOPS_KILL_TEST": tag}
    log = work / "killed.log"  # a file, not a pipe: a surviving worker would hold a pipe open
    with log.open("w") as out:
        stopped = subprocess.run([str(VENV_BIN / "tfmlops"), "--params", str(work / "params.yaml"),
                                  "prepare"], env=env, stdout=out, stderr=out, timeout=300)
    log_text = log.read_text()[-1500:]
    log.unlink()
    return cfg, work, stopped.returncode, log_text, tag


@pytest.mark.parametrize("point", POINTS)
def test_a_prepare_killed_at_any_point_then_run_again_equals_a_cold_one(scene, point):
    root, make_cfg, cold = scene
    cfg, work, code, log_text, tag = _stopped_at(scene, point, "SIGKILL")
    assert code == -signal.SIGKILL, (point, code, log_text)
    assert not _tagged(tag, wait=10), "a pool worker outlived the killed prepare"

    # again, in this process with one worker (the output does not depend on the count)
    prepare.run(trust_cfg(make_cfg, work, root / "photos", workers=1, max_bad_fraction=0.2))
    assert prepared_bytes(cfg) == cold
    assert_rows_match_files(cfg)
    left = [str(p.relative_to(work)) for p in work.rglob("*")
            if any(mark in p.name for mark in TEMP_MARKS)]
    assert left == []


@pytest.mark.parametrize("point", POINTS)
def test_a_prepare_stopped_by_sigterm_at_any_point_then_run_again_equals_a_cold_one(scene, point):
    """SIGTERM runs Python's cleanup (the staged folder's removal, swap-in's roll-back,
    the pool's shutdown) where SIGKILL runs none: neither may lose or mix anything."""
    root, make_cfg, cold = scene
    cfg, work, code, log_text, tag = _stopped_at(scene, point, "SIGTERM")
    assert code == 128 + signal.SIGTERM, (point, code, log_text)
    assert "stopped by SIGTERM" in log_text.strip().splitlines()[-1], log_text
    assert not _tagged(tag, wait=10), "a pool worker outlived the stopped prepare"

    prepare.run(trust_cfg(make_cfg, work, root / "photos", workers=1, max_bad_fraction=0.2))
    assert prepared_bytes(cfg) == cold
    assert_rows_match_files(cfg)
    left = [str(p.relative_to(work)) for p in work.rglob("*")
            if any(mark in p.name for mark in TEMP_MARKS)]
    assert left == []


def test_every_kill_point_is_in_the_code():
    src = Path(__file__).parents[2] / "src" / "tfmlops"
    text = "".join(p.read_text() for p in src.rglob("*.py"))
    harness = (src / "harness.py").read_text()
    for point in POINTS:
        stage, _, step = point.partition(".")
        in_harness = stage == "prepare" and step in STAGE_POINTS and \
            f'stage_point(name, "{step}")' in harness  # the harness's, visited by every stage
        assert f'point("{point}"' in text or f'armed("{point}")' in text or in_harness, point
    assert len(POINTS) >= 20


def test_a_second_prepare_waits_for_the_first_and_neither_mixes_entries(scene):
    """Two real `tfmlops prepare` on one project: the first is held (SIGSTOP) in the
    middle of decoding, holding the lock; the second says it waits, in one line, and
    does; then both finish with a cold run's bytes."""
    root, make_cfg, cold = scene
    work = root / "two-at-once"
    shutil.copytree(root / "template", work)
    cfg = trust_cfg(make_cfg, work, root / "photos", workers=2, max_bad_fraction=0.2)
    cmd = [str(VENV_BIN / "tfmlops"), "--params", str(work / "params.yaml"), "prepare"]
    first = _held_at(cmd, "cache.put")
    try:
        second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = second.stderr.readline()
        assert "another `tfmlops prepare` is writing" in line, line  # the harness's lock
        assert "waiting for it to finish" in line
        time.sleep(0.5)
        assert second.poll() is None  # still waiting while the first is held
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(300) == 0, first.stderr.read()[-1500:]
        assert second.wait(300) == 0, second.stderr.read()[-1500:]
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    assert prepared_bytes(cfg) == cold
    assert_rows_match_files(cfg)


def test_a_file_gone_after_listing_is_quarantined_as_unreadable_and_listed_only(scene):
    """A file that cannot be read when prepare comes to it (deleted after the listing
    here; no permission for a user who is not root) is quarantined with its reason and
    listed in quarantine.json without a copy. prepare used to crash copying it."""
    root, make_cfg, _ = scene
    photos = root / "gone-photos"
    shutil.copytree(root / "photos", photos)
    work = root / "gone"
    cfg = trust_cfg(make_cfg, work, photos, workers=1, max_bad_fraction=0.5,
                    split={"val": 0.2, "test": 0.2, "too_few": "warn"})  # c0 has 3 good left
    cmd = [str(VENV_BIN / "tfmlops"), "--params", str(work / "params.yaml"), "prepare"]
    proc = _held_at(cmd, "prepare.listed")
    try:
        victim = sorted((photos / "c0").glob("*.jpg"))[0]
        victim.unlink()
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(300) == 0, proc.stderr.read()[-1500:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    out = Path(cfg.paths.prepared)
    rel = str(victim.relative_to(photos))
    rows = {row["file"]: row for row in json.loads((out / QUARANTINE).read_text())}
    assert rows[rel]["reason"].startswith("unreadable"), rows
    assert not (out / "quarantine" / rel).exists()
    assert (out / "quarantine" / "c0" / "broken.png").is_file()  # a readable bad file is copied


def _held_at(cmd: list[str], point: str) -> subprocess.Popen:
    """`cmd` started and stopped (SIGSTOP) at the fault point `point`; SIGCONT lets it go on."""
    proc = subprocess.Popen(cmd, env={**os.environ, "TFMLOPS_FAULT": point,
                                      "TFMLOPS_FAULT_SIGNAL": "SIGSTOP"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)
    return proc


def _wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _tagged(tag: str, wait: float) -> list[int]:
    """Live processes started with TFMLOPS_KILL_TEST=tag (a worker inherits it)."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get("TFMLOPS_KILL_TEST") == tag and \
                        proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
