"""Where the project is: its root (also from a `dvc exp run --temp` copy) and the
folders of it no pipeline path may ever be (they would be deleted or swapped out)."""

from __future__ import annotations

import os
from pathlib import Path

_EXPS_TMP = os.sep + os.path.join(".dvc", "tmp", "exps") + os.sep
SQLITE = "sqlite:///"
# The project's own folders: a cache, backup, profile or output path there or below
# would have tfmlops delete or swap out the repository's content.
PROTECTED = (".git", ".dvc", "src", "tests")
# MLFLOW_TRACKING_URI as mlflow.set_tracking_uri exported it (tracking.use_uri), not the user
_exported: str | None = None


def repo_root(start: str | Path | None = None) -> Path:
    """The project root, also from inside a `dvc exp run --temp/--queue` copy.

    DVC runs temporary and queued experiments in `<repo>/.dvc/tmp/exps/<tmp>/`;
    their runs must land in the real repo's store, not in the throwaway copy.
    """
    here = Path(start or os.environ.get("DVC_ROOT") or os.getcwd()).resolve()
    text = str(here) + os.sep
    if _EXPS_TMP in text:
        return Path(text.split(_EXPS_TMP, 1)[0])
    return work_root(here)


def work_root(start: str | Path | None = None) -> Path:
    """The root of the copy the stages run in (relative paths.* resolve there): the
    repository, or a `dvc exp run --temp` copy of it inside its .dvc folder."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / "dvc.yaml").exists() or (p / ".dvc").is_dir():
            return p
    return here


def store_uri(configured: str) -> str:
    """The tracking store in use: MLFLOW_TRACKING_URI (a shared server) wins over params'
    tracking.uri (`configured`); a relative SQLite file or folder is the project's."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    # mlflow.set_tracking_uri exports the variable itself: ignore our own echo.
    uri = env if env and env != _exported else configured
    if uri.startswith(SQLITE) and not uri.startswith("sqlite:////"):
        uri = SQLITE + str(repo_root() / uri[len(SQLITE):])
    elif "://" not in uri:  # a plain folder (file store)
        uri = str(repo_root() / uri)
    return uri


def exported_by_mlflow(uri: str) -> None:
    """`uri` is in MLFLOW_TRACKING_URI because MLflow put it there, not the user."""
    global _exported
    _exported = uri


def local_store(uri: str) -> list[Path]:
    """The files and folders of a local MLflow store at `uri` (its database and
    artifacts, or its folder); none for a server."""
    if uri.startswith(SQLITE):
        db = Path(uri[len(SQLITE):]) if uri.startswith("sqlite:////") \
            else repo_root() / uri[len(SQLITE):]
        return [db, db.parent / "mlartifacts"]
    if uri.startswith("file://"):
        return [Path(uri[len("file://"):])]
    if "://" not in uri:
        return [repo_root() / uri]
    return []


def refusal(path: str | Path, tracking_uri: str) -> str | None:
    """Why a folder tfmlops writes and deletes in must not be `path`, if it must not."""
    p = Path(path).resolve()
    root = work_root()
    if p == Path(p.anchor):
        return "is the filesystem's root"
    if p == Path.home().resolve():
        return "is the home folder"
    if p == root:
        return "is the project's root"
    for name in PROTECTED:
        if p == root / name or root / name in p.parents:
            return f"is {'' if p == root / name else 'inside '}the project's {name} folder"
    for store in local_store(tracking_uri):
        store = store.resolve()
        if p == store or store in p.parents:
            return f"is {'' if p == store else 'inside '}the MLflow store {store}"
        if p in store.parents:
            return f"holds the MLflow store {store}"
    return None
