"""A class-per-folder image tree: list its files, refuse some by name, split them
(`data.store` reads, validates and stores each file).

Corrupt, truncated, zero-byte, non-image and unsupported files never crash
validation and are never dropped silently: each is listed with its reason.

What counts as a class's file (README, "Your own images"):
- every regular file under `root/<class>/`, nested sub-folders included: the
  top folder is the label (`cat/2024/a.jpg` is a `cat`);
- names starting with "." (files and folders, at any depth: .DS_Store, .git,
  .ipynb_checkpoints) are ignored;
- a symlink is followed only when it resolves to a file inside `root`; one that
  resolves outside it, dangles, or points at a folder is refused with that
  reason (listed, never read or copied: the quarantine is a DVC output);
- a class folder name must be valid UTF-8 (it becomes the exported model's
  label), else the whole run is refused, naming the folder.

The split is stratified per class and keyed by content (`assign_splits`): a file
keeps its split however the folder is scanned, identical images always share a
split (no leakage), and adding or removing one file of a class moves at most two
other files of that class between splits (one per boundary).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from tfmlops.errors import DataError

SUPPORTED = {".png", ".jpg", ".jpeg", ".mpo", ".bmp", ".gif"}
SPLITS = ("train", "val", "test")


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
    real = root.resolve()
    files: list[tuple[Path, str]] = []
    refused: list[BadImage] = []
    for cls in classes:
        found: list[Path] = []
        _walk(root / cls, real, cls, found, refused)
        if not found and not any(b.label == cls for b in refused):
            raise DataError(f"class folder {root / cls} is empty; add images or remove the folder")
        files.extend((p, cls) for p in sorted(found))
    return classes, files, refused


def _walk(folder: Path, real_root: Path, label: str, found: list, refused: list) -> None:
    """Files under `folder` (hidden names skipped, symlinks judged, never followed out)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
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
