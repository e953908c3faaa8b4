"""Two checkouts' prepares on one absolute paths.prepare_cache at the same time: a run
that finishes while another is between its two passes leaves that one's cache alone
(no compaction, no memo rewrite under it), and both write what they would alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import child_env
from images import photo_folder
from tfmlops.stages import prepare
from tfmlops.stages.materialize.builtin import write_digits


def _wait_stopped(proc: subprocess.Popen, timeout: float = 120) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        assert proc.poll() is None, proc.communicate()[1]
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.05)
    raise TimeoutError("prepare never reached decode.done")


def test_a_run_finishing_beside_another_leaves_its_cache_entries_in_place(tmp_path, make_cfg):
    shared = tmp_path / "shared_cache"
    write_digits(tmp_path / "digits", limit=60)
    photo_folder(tmp_path / "photos", per_class=4, seed=5)

    def checkout(name: str, images: Path):
        (tmp_path / name).mkdir()
        return make_cfg(tmp_path / name, data={"image_dir": str(images), "workers": 1},
                        paths={"prepare_cache": str(shared)}, tracking={"enabled": False})

    a = checkout("a", tmp_path / "digits")
    prepare.run(a)  # cold: its entries are in the shared cache
    first = {p.name: p.read_bytes() for p in Path(a.paths.prepared).glob("*.tfrecord")}
    # Again, in its own process, held (SIGSTOP) between its passes: it has indexed the
    # cache and reads its entries' bytes only in the write pass.
    held = subprocess.Popen(
        [sys.executable, "-m", "tfmlops", "--params", str(tmp_path / "a" / "params.yaml"),
         "prepare"], cwd=tmp_path / "a", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**child_env(), "TFMLOPS_FAULT": "decode.done",
                        "TFMLOPS_FAULT_SIGNAL": "SIGSTOP"})
    try:
        _wait_stopped(held)
        # Another checkout's run, to its end: to it, a's entries are dead ones, which its
        # compaction would remove (and a's segments with them).
        prepare.run(checkout("b", tmp_path / "photos"))
        segments = sorted(p.name for p in shared.rglob("*.seg"))
    finally:
        held.send_signal(signal.SIGCONT)
        _, err = held.communicate(timeout=120)
    assert held.returncode == 0, err
    assert len(segments) == 2  # a's and b's: no compaction under a
    assert "; 0 decoded, 60 from the cache" in err, err  # a read every entry it indexed
    again = {p.name: p.read_bytes() for p in Path(a.paths.prepared).glob("*.tfrecord")}
    assert again == first
