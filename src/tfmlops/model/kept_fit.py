"""The fit tune's final round keeps for `train` to adopt, and the fingerprint that
says whether train would have made the same one.

tune's final round fits the winner exactly as `train` fits it (same seed, op
determinism, data, callbacks). Keeping that fit in `paths.tuned/fit/` (tune's DVC
output, a train dependency: `dvc checkout` or `dvc pull` brings the fit of that
commit) saves training the final model twice. train adopts it only when its own
fingerprint equals the stored one: everything that decides the weights. Anything
else trains afresh, as `tfmlops train --fresh` does.

Files of a kept fit (FILES): model.keras (best-epoch weights, the optimizer state
train saves), history.json (train's rows), fingerprint.json, fit.json (what train
logs that only the fit knows: the final round's run, fit seconds, resolved
settings) and profile/ (the TensorBoard folder: the profiled steps train profiles).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from tfmlops.artifacts import MODEL_FILE
from tfmlops.config import Config
from tfmlops.files import read_json, write_json
from tfmlops.model.backup import backup_fingerprint
from tfmlops.model.fitting import HISTORY_FILE

log = logging.getLogger(__name__)

KEPT_FIT = "fit"  # paths.tuned/fit/: the winner's fit
FINGERPRINT = "fingerprint.json"
FIT_FACTS = "fit.json"
PROFILE = "profile"
# The source of the code that decides a fit's weights, in the package (its digest is
# in the fingerprint): a fit made by older code is not adopted. Folders: every module.
FIT_SOURCES = ("model", "data", "stages/train/fit.py", "stages/tune/final_fit.py")
ONE_DEVICE = {"strategy": "default", "replicas": 1}  # the final round's placement


def fingerprint(merged: Config, keras, policy: str, placement: dict) -> dict:
    """What decides a fit's weights beyond the code: params and data (train's backup
    fingerprint), the resolved precision policy, strategy and replicas, the library
    versions and this CPU's flags (the same ops compute other bits elsewhere)."""
    import tensorflow as tf

    from tfmlops.model.precision import cpu_flags

    flags = ",".join(sorted(cpu_flags()))
    return {**backup_fingerprint(merged, keras), "precision": policy,
            "strategy": placement["strategy"], "replicas": int(placement["replicas"]),
            "workers": int(placement.get("workers", 1)),
            "tensorflow": tf.__version__, "keras": keras.__version__,
            "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "code": code_digest()}


def code_digest(root: Path | None = None) -> str:
    """sha256 over the FIT_SOURCES files (relative path and bytes), in path order."""
    root = Path(__file__).resolve().parents[1] if root is None else root
    files: list[Path] = []
    for name in FIT_SOURCES:
        path = root / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def differences(stored: dict | None, own: dict) -> list[str]:
    """The fingerprint keys on which a stored fit differs from this run (all: none stored)."""
    if not isinstance(stored, dict):
        return ["no fit kept"]
    return sorted(k for k in set(stored) | set(own) if stored.get(k) != own.get(k))


def seal(folder: Path, print_: dict, facts: dict) -> None:
    """Seal a fit folder that holds model.keras and history.json: facts, then the
    fingerprint last (its presence says the folder is whole)."""
    write_json(folder / FIT_FACTS, facts)
    write_json(folder / FINGERPRINT, print_)


def is_whole(folder: Path, print_: dict) -> bool:
    """Whether `folder` holds a sealed fit with this fingerprint."""
    return (read_json(folder / FINGERPRINT, None) == print_
            and all((folder / n).is_file() for n in (MODEL_FILE, HISTORY_FILE, FIT_FACTS)))


def copy(source: Path, dest: Path) -> None:
    """A sealed fit folder into `dest` (the staging folder of paths.tuned), the
    fingerprint last."""
    dest.mkdir(parents=True)
    for name in (MODEL_FILE, HISTORY_FILE, FIT_FACTS):
        shutil.copy2(source / name, dest / name)
    if (source / PROFILE).is_dir():
        shutil.copytree(source / PROFILE, dest / PROFILE)
    shutil.copy2(source / FINGERPRINT, dest / FINGERPRINT)


def stored_fit(tuned: str | Path) -> tuple[Path, dict | None]:
    """(paths.tuned/fit, its fingerprint or None)."""
    folder = Path(tuned) / KEPT_FIT
    print_ = read_json(folder / FINGERPRINT, None) if folder.is_dir() else None
    return folder, print_


def facts_of(folder: Path) -> dict:
    return read_json(folder / FIT_FACTS, {})


def history_of(folder: Path) -> list[dict]:
    return sorted(json.loads((folder / HISTORY_FILE).read_text()), key=lambda r: r["epoch"])
