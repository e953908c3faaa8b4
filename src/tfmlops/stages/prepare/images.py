"""A class-per-folder image tree: list its files, refuse some by name, split them
(`data.store` reads, validates and stores each file).

Corrupt, truncated, zero-byte, non-image and unsupported files never crash
validation and are never dropped silently: each is listed with its reason.

What counts as a class's file (docs/own-images.md, "What counts as an image of a class"):
- every regular file under `root/<class>/`, nested sub-folders included: the
  top folder is the label (`cat/2024/a.jpg` is a `cat`);
- names starting with "." (files and folders, at any depth: .DS_Store, .git,
  .ipynb_checkpoints) are ignored;
- a symlink is followed only when it resolves to a file inside `root`; one that
  resolves outside it, dangles, or points at a folder is refused with that
  reason (listed, never read or copied: the quarantine is a DVC output);
- a class folder name must be valid UTF-8 (it becomes the exported model's
  label), else the whole run is refused, naming the folder.

Names are untrusted: whoever may write to the folder (or upload to the bucket a
`gs://`/`s3://` image_dir names) chooses them, and a refused file's name becomes
a path under the staging folder (its quarantine copy). A name that could not be
one there as it reads fails the run in one line naming it (`name_refusal`): an
object key with an empty component (`//`, a leading `/`), a `.` or `..` one, or a
backslash; on either engine, a name that is not UTF-8, holds a control character
(a newline) or has a component longer than 255 bytes. It is not skipped, for the
dataset would silently lose a file, and such a name is a mistake or an attack the
user must see; nor quarantined, for the name itself is what cannot be written.
`staged_path` then checks, resolved, that every quarantine copy lands inside its
folder.

The split is stratified per class and keyed by content (`assign_splits`): a file
keeps its split however the folder is scanned, identical images always share a
split (no leakage), and adding or removing one file of a class moves at most two
other files of that class between splits (one per boundary).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tfmlops.errors import DataError

SUPPORTED = {".png", ".jpg", ".jpeg", ".mpo", ".bmp", ".gif"}
SPLITS = ("train", "val", "test")
NAME_MAX = 255  # bytes in one path component (Linux, macOS)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and the backslash


@dataclass(frozen=True)
class BadImage:
    path: Path
    label: str
    reason: str


def list_classes(root: Path) -> list[str]:
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist; set data.image_dir in params.yaml "
                        "to a folder with one sub-folder per class")
    real = root.resolve()
    classes = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            p.name.encode("utf-8")
        except UnicodeEncodeError:  # os.listdir hands undecodable bytes over as surrogates
            raise DataError(f"class folder {os.fsencode(p.name)!r} in {root} is not a valid "
                            "UTF-8 name; rename it (a class folder's name is the label the "
                            "exported model answers)") from None
        if why := name_refusal(p.name):
            raise bad_name(root, p.name, why)
        if p.is_symlink() and not _inside(p.resolve(), real):
            raise DataError(f"class folder {p} is a symlink to {p.resolve()}, outside "
                            f"data.image_dir {root}; move or copy that folder into {root}")
        classes.append(p.name)
    if len(classes) < 2:
        raise DataError(f"image folder {root} has {len(classes)} class folder(s); it needs at "
                        "least 2 (one sub-folder per class)")
    return classes


def list_files(root: Path) -> tuple[list[str], list[tuple[Path, str]], list[BadImage]]:
    """Classes, every usable (file, class) under `root/<class>/` in a fixed order, and
    the entries refused by what they are (symlinks leading out of `root`, ...)."""
    classes = list_classes(root)
    files: list[tuple[Path, str]] = []
    refused: list[BadImage] = []
    for cls in classes:
        found, bad = list_class(root, cls)
        files.extend((p, cls) for p in found)
        refused.extend(bad)
    return classes, files, refused


def list_class(root: Path, cls: str) -> tuple[list[Path], list[BadImage]]:
    """One class folder's usable files and refused entries, each sorted by path (the
    Beam engine's workers list one class each: beam_listing)."""
    found: list[Path] = []
    refused: list[BadImage] = []
    _walk(root / cls, root.resolve(), cls, found, refused)
    if not found and not refused:
        raise DataError(f"class folder {root / cls} is empty; add images or remove the folder")
    return sorted(found), sorted(refused, key=lambda b: b.path)


def _walk(folder: Path, real_root: Path, label: str, found: list, refused: list) -> None:
    """Files under `folder` (hidden names skipped, symlinks judged, never followed out)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
            # name_refusal's checks that a name on disk can fail, in its cheapest order
            # (a symlink's too: its name is listed)
            if _UNSAFE.search(entry.name) or not (entry.name.isascii() or _utf8(entry.name)):
                raise bad_name(folder, entry.name, name_refusal(entry.name))
            if entry.is_symlink():
                reason = _symlink_refusal(path, real_root)
                if reason:
                    refused.append(BadImage(path, label, reason))
                else:
                    found.append(path)
            elif entry.is_dir(follow_symlinks=False):
                _walk(path, real_root, label, found, refused)
            elif entry.is_file(follow_symlinks=False):
                found.append(path)


def name_refusal(rel: str) -> str | None:
    """Why `rel`, a '/'-separated path below data.image_dir (an object key below the
    folder URL, or a file's name on disk), cannot name a file under the staging folder
    as it is; None when it can. A leading '/' is an empty first component."""
    if not _utf8(rel):
        return "not valid UTF-8"
    if m := _UNSAFE.search(rel):
        return "a backslash" if m.group() == "\\" else f"a control character {m.group()!r}"
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            return f"a {part!r} path component" if part else "an empty path component ('//')"
        if len(part.encode()) > NAME_MAX:
            return f"a component longer than {NAME_MAX} bytes"
    return None


def bad_name(folder, name: str, why: str) -> DataError:
    """The one-line error for `name` in `folder` (a path or URL), refused for `why`."""
    full = f"{str(folder).rstrip('/')}/{name}"
    try:
        shown = repr(full) if _utf8(full) else repr(os.fsencode(full))
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to
        shown = ascii(full)
    return DataError(f"{shown[:300]} has a name prepare cannot use ({why}); rename or remove "
                     "it (below data.image_dir: <class>/.../<file>, UTF-8, with no empty, '.' or "
                     "'..' component, backslash or control character)")


def list_keys(url: str, paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """`list_files` for the file URLs a store lists below folder `url`: classes and
    (file URL, class) in the local listing's order. Keys are untrusted: one that
    `name_refusal` refuses fails the run naming it, before any file is read; then, as
    on disk, hidden names and files beside the class folders are skipped, and a key
    ending in '/' is a folder (S3's console makes these), not a file."""
    root = url.rstrip("/")
    found: list[tuple[str, ...]] = []
    for path in paths:
        if not path.startswith(root + "/"):
            raise bad_name(url, path, "not below the folder")
        rel = path[len(root) + 1:]
        folder = rel.endswith("/")
        if rel and (why := name_refusal(rel[:-1] if folder else rel)):
            raise bad_name(url, rel, why)
        parts = tuple(rel.split("/"))
        if rel and not folder and len(parts) > 1 and not any(x.startswith(".") for x in parts):
            found.append(parts)
    found.sort()
    folders = {p[:i] for p in found for i in range(1, len(p))}
    for parts in found:  # the same name as a file and as a folder: no file system holds both
        if parts in folders:
            raise bad_name(url, "/".join(parts), "both a file and a folder of files")
    classes = sorted({p[0] for p in found})
    return classes, [(f"{root}/{'/'.join(p)}", p[0]) for p in found]


def staged_path(folder: Path, rel: str) -> Path:
    """`folder / rel` for a write (a quarantine copy), once checked to stay inside
    `folder` however `rel` reads: refused by `name_refusal`, or when it resolves (links
    followed) outside. The listings refuse such names first: this is the last guard."""
    target = Path(folder) / rel
    why = name_refusal(rel)
    if why is None and Path(folder).resolve() not in target.resolve().parents:
        why = "it resolves outside the folder"
    if why:
        raise DataError(f"prepare refuses to write {ascii(rel)[:300]} under {folder}: {why} "
                        "(a bug: please report it)")
    return target


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.listdir hands undecodable bytes over as surrogates
        return False
    return True


def _symlink_refusal(path: Path, real_root: Path) -> str | None:
    target = path.resolve()
    if not _inside(target, real_root):
        return "symlink leading outside data.image_dir: not followed"
    if target.is_dir():
        return "symlink to a folder: not followed (link the files, or move the folder)"
    if not target.is_file():
        return "broken symlink: its target does not exist"
    return None


def _inside(target: Path, real_root: Path) -> bool:
    return target == real_root or real_root in target.parents


def unsupported(path: Path) -> str | None:
    """The reason a file is refused by its name alone, if it is."""
    if path.suffix.lower() not in SUPPORTED:
        return f"unsupported extension {path.suffix or '(none)'}"
    return None


def check_empty_classes(root: Path, classes: list[str], good_labels: set[str]) -> None:
    empty = [c for c in classes if c not in good_labels]
    if empty:
        raise DataError(f"class folder {root}/{empty[0]} has no readable image; fix or remove "
                        "its files")


def split_bounds(n: int, val: float, test: float) -> tuple[int, int]:
    """(b1, b2): of a class's n distinct images ordered by a hash of (seed, sha256),
    ranks below b1 go to test, below b2 to val, the rest to train.

    Both are the cumulative shares rounded half up, so each grows by at most one
    when n grows by one (what bounds how many files an added file moves); from
    n = 3 on, every split gets at least one image.
    """
    b1 = int(n * test + 0.5)
    b2 = int(n * (test + val) + 0.5)
    if n >= 3:
        b1 = min(max(b1, 1), n - 2)
        b2 = min(max(b2, b1 + 1), n - 1)
    return b1, b2


def assign_splits(items, seed: int, val: float, test: float) -> dict[str, str]:
    """{sha256: split} for `items` [(sha256, label)], stratified per label.

    A content found under several labels takes its split in the first label
    that has it (in the items' order), so identical bytes never straddle splits.
    """
    by_label: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for sha, label in items:
        if sha not in owner:
            owner[sha] = label
            by_label.setdefault(label, []).append(sha)
    splits: dict[str, str] = {}
    for shas in by_label.values():
        ranked = sorted(shas, key=lambda h: hashlib.sha256(f"{seed}:{h}".encode()).digest())
        b1, b2 = split_bounds(len(ranked), val, test)
        for rank, sha in enumerate(ranked):
            splits[sha] = "test" if rank < b1 else "val" if rank < b2 else "train"
    return splits
