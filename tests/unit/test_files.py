"""Atomic writes (issue 14.11): the bytes and the rename reach the disk (fsync of the
file and its folder), and the temp files of a killed writer go on the next write."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from tfmlops import files


@pytest.fixture
def fsyncs(monkeypatch):
    """What os.fsync was called on ("file" or "dir"); the real fsync still runs."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd):
        seen.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


@pytest.mark.parametrize("write", [
    lambda p: files.write_text(p / "a.txt", "x"),
    lambda p: files.write_json(p / "a.json", {"a": 1}),
    lambda p: files.write_csv(p / "a.csv", [{"a": 1}], ["a"]),
])
def test_each_write_syncs_the_file_then_its_folder(tmp_path, fsyncs, write):
    path = write(tmp_path)
    assert fsyncs == ["file", "dir"]
    assert path.is_file() and not list(tmp_path.glob(".*tmp*"))


def test_csv_and_json_content_unchanged(tmp_path):
    files.write_csv(tmp_path / "a.csv", [{"a": 1, "b": "x,y"}], ["a", "b"])
    assert (tmp_path / "a.csv").read_bytes() == b'a,b\r\n1,"x,y"\r\n'
    files.write_json(tmp_path / "a.json", {"b": 1, "a": [1.5]})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'


def test_swap_in_syncs_the_new_tree_before_the_rename(tmp_path, fsyncs):
    stage = files.staging_dir(tmp_path / "out")
    (stage / "sub").mkdir()
    (stage / "sub" / "model.bin").write_bytes(b"1")
    (stage / "m.json").write_text("{}")
    files.swap_in(stage, tmp_path / "out")
    assert fsyncs.count("file") == 2 and fsyncs.count("dir") >= 3
    assert (tmp_path / "out" / "sub" / "model.bin").read_bytes() == b"1"


def _killed_writer(folder) -> int:
    """A real process that starts an atomic write and is SIGKILLed before its rename."""
    code = ("import os, signal, pathlib\n"
            f"tmp = pathlib.Path({str(folder)!r}) / f'.report.json.tmp{{os.getpid()}}'\n"
            "tmp.write_text('{\"half\": ')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return proc.pid


def test_temp_files_of_killed_writers_go_on_the_next_write(tmp_path):
    dead = _killed_writer(tmp_path)
    left = tmp_path / f".report.json.tmp{dead}"
    assert left.is_file()  # what a kill used to leave forever
    png = tmp_path / f".plot.png.tmp{dead}.png"  # matplotlib wants the suffix
    png.write_bytes(b"")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f".other.json.tmp{sleeper.pid}"  # a writer still at work
        alive.write_text("{")
        keep = [tmp_path / ".hidden", tmp_path / "notes.tmp123", tmp_path / ".tmp42"]
        for p in keep:
            p.write_text("mine")
        files.write_json(tmp_path / "metrics.json", {"a": 1})
        assert not left.exists() and not png.exists()
        assert alive.exists() and all(p.exists() for p in keep)
    finally:
        sleeper.kill()
        sleeper.wait()
    files.write_json(tmp_path / "metrics.json", {"a": 2})
    assert not alive.exists()


def test_a_temp_like_name_with_a_pid_too_large_for_any_process_is_left_alone(tmp_path):
    """`os.kill` raises OverflowError for such a pid: every write into the folder failed."""
    odd = tmp_path / f".x.json.tmp{'9' * 20}"
    odd.write_text("not ours")
    files.write_json(tmp_path / "metrics.json", {"a": 1})
    assert odd.read_text() == "not ours"


def test_only_this_machines_dead_writers_lose_their_temp_files(tmp_path):
    """A shared folder (NFS, a volume of several pods): a pid names a process only on
    the machine that gave it, and the temp file's name says which machine that was."""
    code = ("import os, signal, pathlib\n"
            "from tfmlops import files\n"
            f"tmp = files.temp_name(pathlib.Path({str(tmp_path)!r}) / 'report.json')\n"
            "tmp.write_text('{\"half\": ')\n"
            "print(os.getpid(), tmp.name, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    pid, name = proc.stdout.split()
    mine = tmp_path / name
    host, machine = files.machine_id()
    assert name == f".report.json.tmp{pid}-{host}-{machine}"
    # the same dead pid on other machines: another host; this host in another container
    # (another pid namespace) or after a reboot (another boot id)
    others = [tmp_path / f".report.json.tmp{pid}-elsewhere-0123abcd",
              tmp_path / f".report.json.tmp{pid}-{host}-{'0' * 8}",
              tmp_path / f".plot.png.tmp{pid}-elsewhere-0123abcd.png"]
    for p in others:
        p.write_text("in flight")
    old = tmp_path / f".old.json.tmp{pid}"  # the older form names no machine
    old.write_text("{")
    files.write_json(tmp_path / "metrics.json", {"a": 1})
    assert not mine.exists() and not old.exists()
    assert all(p.read_text() == "in flight" for p in others)
    assert files.temp_name(tmp_path / "x.png", ".png").name.endswith(f"-{machine}.png")
