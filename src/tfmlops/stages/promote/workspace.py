"""What the git checkout holds, as promotion's rules need it: HEAD, the branch, whether
a tracked input differs from HEAD, and which commit contains which.

Plain `dvc repro` may move @production only from committed work: the inputs that decide
the model (params.yaml, dvc.yaml, src/, *.dvc, .dvc/config, the data contract's
reference) must equal HEAD. dvc.lock and the declared outputs are not inputs: DVC and the
stages rewrite them during every repro, before promote runs.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

INPUTS = ("params.yaml", "dvc.yaml", "src", ".dvc/config", ":(glob)**/*.dvc")


@dataclass(frozen=True)
class Checkout:
    """The git facts of one checkout; `head` is None outside a git repository."""

    root: Path
    head: str | None
    branch: str | None  # None: detached HEAD (or no repository)
    changed: tuple[str, ...]  # inputs that differ from HEAD (or are untracked in src/)

    @classmethod
    def read(cls, root: Path, extra_inputs: tuple[str, ...] = ()) -> Checkout:
        head = _git(root, "rev-parse", "--verify", "-q", "HEAD")
        if head is None:
            return cls(root, None, None, ())
        branch = _git(root, "symbolic-ref", "--short", "-q", "HEAD") or None
        status = _git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--",
                      *INPUTS, *extra_inputs, strip=False) or ""
        # "XY path\0" per entry (a rename adds its old path as an entry of its own)
        changed = tuple(sorted({item[3:] if item[2:3] == " " else item
                                for item in status.split("\0") if item}))
        return cls(root, head, branch, changed)

    def contains(self, ancestor: str, commit: str | None = None) -> bool | None:
        """Whether `commit` (HEAD by default) contains `ancestor`; None when either is not
        a commit this repository knows (a teammate's, not fetched)."""
        commit = commit or self.head
        if not commit or not ancestor or not _known(self.root, ancestor) or not _known(self.root, commit):
            return None
        done = subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, commit],
                              cwd=self.root, capture_output=True, timeout=30)
        return done.returncode == 0


def _known(root: Path, commit: str) -> bool:
    return _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is not None


def _git(root: Path, *args: str, strip: bool = True) -> str | None:
    """stdout of a git command (stripped), or None when it fails or git is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def short(commit: str | None) -> str:
    return (commit or "unknown")[:10]
