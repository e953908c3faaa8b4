"""Atomic writes: a kill or a power cut leaves the old file or the new one, never half of one.

A file is written to `.<name>.tmp<pid>-<host>-<machine>` beside it (`temp_name`),
flushed to disk (fsync), renamed over the old one, and the folder is synced so the
rename itself survives a power cut. A process killed mid-write leaves its temp file
behind: the next write into that folder removes the temp files of this machine's
processes that are gone. A pid means something only on the machine that gave it,
and a folder may be shared (NFS, a volume mounted in several pods): the name says
which machine wrote it (`machine_id`: host, boot and pid namespace), and another
machine's temp files are left alone. Names of the older `.<name>.tmp<pid>` form
name no machine: they are judged by the local pid, as before. Output folders are
built in a staging sibling and swapped in whole (`staging_dir`, `swap_in`).

Folders the project deletes from are provably its own: each folder it makes
to delete later carries a marker file naming its kind (`claim_folder`), and a
child is deleted only when it has that marker and the kind's name pattern
(`owned_children`): a neighbour's folder in a shared scratch place survives.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tfmlops import faults

log = logging.getLogger(__name__)

MARKER = ".tfmlops-owned"  # in each folder tfmlops made and may delete; holds its kind
# `.<name>.tmp<pid>-<host>-<machine>` (older: `.<name>.tmp<pid>`), optionally with a
# suffix a library insists on (`.png`). Other modules match it inside their own patterns.
TEMP_PATTERN = (r"\..+\.tmp(?P<pid>\d+)(?:-(?P<host>[A-Za-z0-9_]{1,32})-(?P<machine>[0-9a-f]{8}))?"
                r"(\.[A-Za-z0-9]+)?")
_TEMP = re.compile(TEMP_PATTERN)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_bytes(path: str | Path, data: bytes) -> Path:
    with _replacing(path, "wb") as fh:
        fh.write(data)
    return Path(path)


@contextlib.contextmanager
def _replacing(path: str | Path, mode: str):
    """A temp file beside `path` to write, put in `path`'s place whole once the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    tmp = temp_name(path)
    with tmp.open(mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
    faults.point("json.temp")
    os.replace(tmp, path)
    sync_dir(path.parent)  # and the rename is too


def read_json(path: str | Path, default: Any) -> Any:
    """The JSON in `path`; `default` when it is missing or unreadable (a kill mid-write)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=_default) + "\n")


def write_json_streamed(path: str | Path, data: Any, key: str | None = None) -> Path:
    """`write_json`'s bytes for `data` whose list at `key` (None: `data` itself) is given
    as an iterable, each item written as it comes: the list is never in memory whole
    (prepare's manifest files, quarantine rows on Apache Beam)."""
    items = iter(data if key is None else data[key])
    first = next(items, _END)
    if first is _END:
        return write_json(path, [] if key is None else {**data, key: []})
    mark = "\x00items\x00"
    text = json.dumps([mark] if key is None else {**data, key: [mark]}, indent=2,
                      sort_keys=True, default=_default) + "\n"
    before, after = text.split(json.dumps(mark))
    indent = "\n" + before.rsplit("\n", 1)[1]

    def item(value) -> str:
        return json.dumps(value, indent=2, sort_keys=True, default=_default).replace("\n", indent)

    with _replacing(path, "w") as fh:
        fh.write(before + item(first))
        for value in items:
            fh.write("," + indent + item(value))
        fh.write(after)
    return Path(path)


_END = object()


def write_csv(path: str | Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> Path:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return write_text(path, buf.getvalue())


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures here are files, never a window (no
    display on CI machines or servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_png(path: str | Path, fig, **savefig) -> Path:
    """A pyplot figure as a PNG, written as every file here is (atomic, synced); the figure
    is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    pyplot().close(fig)
    return write_bytes(path, buf.getvalue())


def temp_name(path: Path, suffix: str = "") -> Path:
    """The temp file this process writes `path` through (cleaned if it dies mid-write);
    `suffix` for a library that picks the format by it (matplotlib: `.png`)."""
    host, machine = machine_id()
    return path.with_name(f".{path.name}.tmp{os.getpid()}-{host}-{machine}{suffix}")


@functools.cache
def machine_id() -> tuple[str, str]:
    """(host name, as a file name may hold it; 8 hex digits of host, boot and pid
    namespace): a pid is unique only within one boot of one pid namespace, and two
    containers may share a host name or a host its boot."""
    host = socket.gethostname()
    key = "\0".join((host, boot_id(), pid_namespace()))
    return re.sub(r"[^A-Za-z0-9]", "_", host)[:32] or "_", hashlib.sha1(key.encode()).hexdigest()[:8]


def boot_id() -> str:
    """This boot's id (Linux), or "" if unknown."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def pid_namespace() -> str:
    """This process's pid namespace (its inode), or "" if unknown."""
    with contextlib.suppress(OSError):
        return str(os.stat("/proc/self/ns/pid").st_ino)
    return ""


def remove_stale_temps(folder: str | Path) -> None:
    """Delete the temp files in `folder` written by a process of this machine that is
    gone; another machine's (its name says whose) are left alone."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = _TEMP.fullmatch(entry.name)
            if m is None or pid_alive(int(m["pid"])):
                continue
            if m["machine"] is not None and (m["host"], m["machine"]) != machine_id():
                continue  # another machine's pid: nothing to judge it by here
            with contextlib.suppress(FileNotFoundError):  # another cleaner was first
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
    if removed:
        log.info("removed %d temp file(s) left by killed processes in %s", removed, folder)


def sync_dir(folder: str | Path) -> None:
    """fsync a folder: makes the renames and creations inside it durable (a file's path
    works too: its data)."""
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def staging_dir(final: str | Path) -> Path:
    """An empty sibling folder to build an output in before `swap_in`."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def swap_in(tmp: Path, final: str | Path) -> Path:
    """Replace `final` by the finished `tmp` folder (synced to disk first). A kill -9
    between the two renames leaves `.<name>.old`: the next swap removes it; an
    exception there (SIGTERM, Ctrl-C) puts the old folder back first."""
    final = Path(final)
    _sync_tree(tmp)
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        try:
            faults.point("swap.old")
            os.replace(tmp, final)
        except BaseException:  # SIGTERM or Ctrl-C between the renames: the old one back
            if old.exists() and not final.exists():
                os.replace(old, final)
            raise
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    sync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def claim_folder(folder: str | Path, kind: str) -> Path:
    """Make `folder` (if need be) and mark it as tfmlops' own, of `kind`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not owned(folder, kind):
        (folder / MARKER).write_text(kind + "\n")
    return folder


def owned(folder: str | Path, kind: str) -> bool:
    """Whether `folder` carries tfmlops' marker of `kind`."""
    try:
        return (Path(folder) / MARKER).read_text().strip() == kind
    except (OSError, UnicodeDecodeError):
        return False


def owned_children(parent: str | Path, kind: str, pattern: str) -> list[Path]:
    """The sub-folders of `parent` tfmlops may delete: a real folder (not a symlink),
    named by `pattern` (a regex matched whole), carrying the marker of `kind`."""
    name = re.compile(pattern)
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    return sorted(Path(e.path) for e in entries
                  if e.is_dir(follow_symlinks=False) and name.fullmatch(e.name)
                  and owned(e.path, kind))


@contextlib.contextmanager
def hold_lock(path: str | Path, waiting: str):
    """Hold an exclusive lock on file `path` for the block, across processes. If another
    process holds it, log `waiting` (one line) and wait. The kernel releases the lock
    when the holder dies, however it dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning(waiting)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (written by TensorFlow, tf2onnx...)."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            sync_dir(os.path.join(root, name))
        sync_dir(root)


def link_or_copy(source: str | Path, target: str | Path) -> None:
    """`target` as a hard link to `source` (what a later writer replaces stays as it is
    now, for free); a copy where they are on different filesystems."""
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (one we may not signal counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: it exists, owned by someone
        return True  # else; OverflowError: more digits than a pid has, not a name we gave
    return True


def _default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
