"""requirements.lock still satisfies pyproject.toml (what `./dev lock` would have to
change), checked offline: every direct requirement of the project and of the extras
`./dev` installs (test, beam) is pinned in the lock, at a version its specifier allows."""

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_dev_gpu_extra import LOCK, pins

from conftest import ROOT

LOCKED_EXTRAS = ("test", "beam")  # dev: extras=test,beam; the lock's header says the same


def locked() -> dict[str, str]:
    """{normalised name: version} of requirements.lock."""
    return {name: version for name, (version, _) in pins(LOCK).items()}


def unsatisfied(pyproject: str, locked: dict[str, str]) -> dict[str, str | None]:
    """{requirement: the locked version (None: not in the lock)} for each one it fails."""
    project = tomllib.loads(pyproject)["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in LOCKED_EXTRAS:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return {str(r): locked.get(canonicalize_name(r.name)) for r in wanted
            if r.name and not r.specifier.contains(locked.get(canonicalize_name(r.name), "0.0.0a0"),
                                                   prereleases=True)}


def test_every_requirement_is_locked_at_a_version_it_allows():
    lock = (ROOT / LOCK).read_text()
    wrong = unsatisfied((ROOT / "pyproject.toml").read_text(), locked())
    assert wrong == {}, f"run ./dev lock: pyproject.toml asks for what the lock lacks: {wrong}"
    assert all(f"--extra {e}" in lock.splitlines()[1] for e in LOCKED_EXTRAS)
    assert "extras=test,beam " in (ROOT / "dev").read_text()


def test_a_requirement_the_lock_does_not_satisfy_is_reported():
    pyproject, lock = (ROOT / "pyproject.toml").read_text(), locked()
    moved = pyproject.replace('"tensorflow==2.21.*"', '"tensorflow==2.22.*"')
    added = pyproject.replace('"PyYAML>=6",', '"PyYAML>=6",\n  "not-a-locked-package>=1",')
    assert list(unsatisfied(moved, lock)) == ["tensorflow==2.22.*"]
    assert unsatisfied(added, lock) == {"not-a-locked-package>=1": None}
