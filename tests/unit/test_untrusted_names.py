"""Names below data.image_dir are untrusted (review H2): an object key or a file name
chosen by whoever may write to the bucket or folder. Searched here against the listing
and path functions themselves, not whole Beam runs (test_beam_keys.py runs one): a
refused name fails the listing in one line and never gives a class, and every
quarantine copy lands inside its folder, however its name reads."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tfmlops.errors import DataError
from tfmlops.stages.prepare.images import list_files, list_keys, name_refusal, staged_path
from tfmlops.stages.prepare.stream import quarantine

URL = "s3://bucket/photos"
ABS = "@ABS@"  # replaced by an absolute path outside the stage's folder, per example

# Path components an uploader may choose: ordinary, hidden, empty, dot-dot, absolute,
# Windows-style, control characters, lone surrogates, look-alike slashes, long.
COMPONENTS = st.one_of(
    st.sampled_from(["cat", "dog", "a.png", "b.jpg", "x.sh", ".hidden", ".DS_Store", "", ".",
                     "..", ABS, "a\\b", "..\\..\\x", "new\nline", "tab\there", "nul\x00",
                     "caf\udce9", "\ud800", "\u2215slash", "\uff0fwide", "\u202eRTL", "é",
                     "x" * 256, "CON", " "]),
    st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=8),
)
KEYS = st.lists(st.lists(COMPONENTS, min_size=1, max_size=4).map("/".join), max_size=4)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def refused(key: str) -> bool:
    """Whether the listing must refuse `key`: the rules written out again, apart from
    name_refusal (the folder itself and a folder marker, a key ending in '/', are no
    files)."""
    name = key[:-1] if key.endswith("/") else key
    if not key:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return ("\\" in name or any(c < " " or c == "\x7f" for c in name)
            or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in name.split("/")))


def everything_under(folder: Path) -> set[Path]:
    return {Path(r) / n for r, ds, fs in os.walk(folder) for n in ds + fs}


def one_line(exc: DataError) -> str:
    (line,) = str(exc).splitlines()
    return line


@SETTINGS
@given(keys=KEYS)
@example(keys=["photos//" + ABS])  # the review's key
@example(keys=["cat/../../outside/x.sh"])
@example(keys=["..", "cat/./x.png"])
@example(keys=["cat\\..\\..\\x.sh/y.png"])
@example(keys=["cat/new\nline.png"])
@example(keys=["cat/" + "x" * 256])
@example(keys=["caf\udce9/x.png"])
def test_a_refused_key_fails_the_listing_and_no_write_leaves_the_quarantine(keys):
    sandbox = Path(tempfile.mkdtemp())
    try:
        outside = sandbox / "outside"
        keys = ["cat/1.png", "dog/2.png"] + [k.replace(ABS, str(outside / "planted"))
                                             for k in keys]
        out = sandbox / "stage"
        try:
            classes, files = list_keys(URL, [f"{URL}/{k}" for k in keys])
        except DataError as exc:
            assert "has a name prepare cannot use" in one_line(exc)
            assert any(refused(k) for k in keys) or "both a file and a folder" in str(exc)
        else:
            assert not any(refused(k) for k in keys)
            for cls in classes:  # a class is a valid, visible name
                assert not refused(cls) and not cls.startswith(".")
            assert {c for _, c in files} == set(classes) and "" not in classes
        # the last guard: whatever the listing let through, no write leaves the folder
        for key in keys:
            try:
                quarantine(out, key, b"planted")
            except (DataError, OSError):  # OSError: a file where a folder is (inside)
                pass
        written = everything_under(sandbox)
        assert all(out / "quarantine" in p.parents for p in written - {out, out / "quarantine"})
        assert not outside.exists()
    finally:
        shutil.rmtree(sandbox)


def test_the_reviews_key_fails_naming_it_before_any_class_is_made():
    key = "photos//tmp/x/planted.sh"
    with pytest.raises(DataError) as err:
        list_keys("s3://bucket", ["s3://bucket/photos/cat/1.png", f"s3://bucket/{key}"])
    assert one_line(err.value).startswith(f"'s3://bucket/{key}' has a name prepare cannot use "
                                          "(an empty path component ('//'))")


def test_folder_markers_and_hidden_keys_are_no_files_and_are_not_refused():
    classes, files = list_keys(URL, [f"{URL}/", f"{URL}/cat/", f"{URL}/cat/1.png",
                                     f"{URL}/dog/.DS_Store", f"{URL}/dog/2.png",
                                     f"{URL}/.git/HEAD", f"{URL}/top.png"])
    assert classes == ["cat", "dog"]
    assert files == [(f"{URL}/cat/1.png", "cat"), (f"{URL}/dog/2.png", "dog")]


def test_a_write_through_a_link_inside_the_quarantine_is_refused(tmp_path):
    """staged_path resolves: a name that passes name_refusal but leads out through a
    link (none the stage makes) is still refused."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "stage" / "quarantine").mkdir(parents=True)
    (tmp_path / "stage" / "quarantine" / "cat").symlink_to(tmp_path / "outside")
    with pytest.raises(DataError, match="resolves outside the folder"):
        staged_path(tmp_path / "stage" / "quarantine", "cat/x.sh")
    assert staged_path(tmp_path / "stage" / "quarantine", "dog/x.sh").name == "x.sh"


# ------------------------------------------------------------- the local engine's names

NAMES = st.sampled_from([b"ok.png", b"two.jpg", b"caf\xe9.png", b"\xff\xfe.png", b"new\nline.png",
                         b"back\\slash.png", b"cr\r.png", b".hidden\xff", b"\xe2\x80\xae.png",
                         b"\xc3\xa9t\xc3\xa9.png", b"tab\t.png"])
LINKS = st.sampled_from(["file_out", "dir_out", "dir_in", "class_out", "class_in", "dangling"])


@SETTINGS
@given(names=st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c\xff", b"d\n"]), NAMES),
                      max_size=6),
       links=st.lists(LINKS, max_size=3, unique=True))
def test_local_names_are_refused_in_one_line_or_copied_inside_the_quarantine(names, links):
    sandbox = Path(tempfile.mkdtemp())
    try:
        root, outside, out = sandbox / "imgs", sandbox / "outside", sandbox / "stage"
        for cls in (b"a", b"b"):
            _write(root, cls, b"base.png", b"not an image")
        (outside / "sub").mkdir(parents=True)
        (outside / "secret.png").write_bytes(b"secret")
        for cls, name in names:
            _write(root, cls, name, b"junk " + name)
        _links(root, outside, links)
        before = {p: p.read_bytes() for p in everything_under(outside) if p.is_file()}
        try:
            classes, files, bad = list_files(root)
        except DataError as exc:
            line = one_line(exc)
            assert ("has a name prepare cannot use" in line or "not a valid UTF-8" in line
                    or ("is a symlink to" in line and "class_out" in links)), line
            assert _has_bad_name(names) or "class_out" in links
        else:
            assert not _has_bad_name(names) and "class_out" not in links
            assert all(name_refusal(c) is None for c in classes)
            for path, _ in files:
                rel = str(path.relative_to(root))
                assert name_refusal(rel) is None
                quarantine(out, rel, path)  # what prepare does with a refused file
            # links out of the folder are listed with their reason, never read (as before)
            assert all(outside not in p.resolve().parents for p, _ in files)
            expected = {"file_out": "out.png", "dir_out": "outdir", "dangling": "gone.png"}
            assert {expected[x] for x in links if x in expected} <= {b.path.name for b in bad}
        assert all(out / "quarantine" in p.parents
                   for p in everything_under(out) - {out / "quarantine"})
        assert {p: p.read_bytes() for p in everything_under(outside) if p.is_file()} == before
    finally:
        shutil.rmtree(sandbox)


def _write(root: Path, cls: bytes, name: bytes, data: bytes) -> None:
    folder = os.fsencode(root) + b"/" + cls
    os.makedirs(folder, exist_ok=True)
    with open(folder + b"/" + name, "wb") as fh:
        fh.write(data)


def _links(root: Path, outside: Path, links: list[str]) -> None:
    made = {"file_out": (root / "a" / "out.png", outside / "secret.png"),
            "dir_out": (root / "a" / "outdir", outside / "sub"),
            "dir_in": (root / "b" / "indir", root / "a"),
            "class_out": (root / "class_out", outside / "sub"),
            "class_in": (root / "class_in", root / "a"),
            "dangling": (root / "b" / "gone.png", root / "nothing.png")}
    for name in links:
        link, target = made[name]
        link.symlink_to(target)


def _has_bad_name(names) -> bool:
    return any(refused(os.fsdecode(part)) for cls, name in names for part in (cls, name)
               if not os.fsdecode(part).startswith("."))
