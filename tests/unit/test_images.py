"""prepare's streaming core quarantines each kind of bad file; the split is stable and
stratified."""

import hashlib
import os
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from images import mixed_folder
from tfmlops.data.store import ImageCache
from tfmlops.errors import DataError
from tfmlops.stages.materialize.builtin import write_digits
from tfmlops.stages.prepare.images import assign_splits, check_empty_classes, list_files, split_bounds
from tfmlops.stages.prepare.stream import prepare_stream, store_spec


def prepared(make_cfg, root: Path, channels: int = 1):
    """What prepare makes of `root`, by the calls stages/prepare makes: classes,
    {relative path: (label, stored bytes)} of the usable files, {relative path: reason}
    of the refused ones."""
    cfg = make_cfg(data={"image_dir": str(root), "channels": channels},
                   tracking={"enabled": False})
    classes, files, refused = list_files(root)
    out = Path(cfg.paths.prepared)
    out.mkdir(parents=True, exist_ok=True)
    tally = prepare_stream(cfg, root, classes, files, out)
    check_empty_classes(root, classes, {row[2] for row in tally.rows})
    cache = ImageCache(cfg.paths.prepare_cache, store_spec(cfg))
    try:
        good = {rel: (label, cache.get(sha).data) for rel, sha, label, *_ in tally.rows}
    finally:
        cache.close()
    bad = {b["file"]: b["reason"] for b in tally.bad}
    bad.update({str(b.path.relative_to(root)): b.reason for b in refused})
    return classes, good, bad


def content_labels(root: Path) -> list[tuple[str, str]]:
    """(sha256, label) of every file under `root`'s classes: what the split is keyed by."""
    _, files, _ = list_files(root)
    return [(hashlib.sha256(path.read_bytes()).hexdigest(), label) for path, label in files]


def test_each_bad_kind_is_quarantined_with_its_reason(tmp_path, make_cfg):
    expected = mixed_folder(tmp_path / "imgs")
    classes, good, reasons = prepared(make_cfg, tmp_path / "imgs")
    assert classes == ["0", "1", "2"]
    assert set(reasons) == set(expected)
    for rel, reason in expected.items():
        assert reasons[rel].startswith(reason), (rel, reasons[rel])
    assert len(good) == 36


@pytest.mark.parametrize("channels, mode", [(1, "L"), (3, "RGB")])
def test_every_good_image_is_converted_to_the_channel_count(tmp_path, make_cfg, channels, mode):
    import io

    mixed_folder(tmp_path / "imgs", per_class=5)
    _, good, _ = prepared(make_cfg, tmp_path / "imgs", channels)
    sources = Counter(Path(rel).suffix.lower() for rel in good)
    assert {".jpg", ".png", ".bmp", ".gif"} <= set(sources)
    for _, data in good.values():
        assert Image.open(io.BytesIO(data)).mode == mode


def test_transparent_pixels_become_white_not_black(tmp_path, make_cfg):
    import io

    root = tmp_path / "imgs"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(root / "a" / "clear.png")
    Image.new("L", (4, 4), 0).save(root / "b" / "black.png")
    _, good, _ = prepared(make_cfg, root)
    _, clear = good["a/clear.png"]
    assert Image.open(io.BytesIO(clear)).getpixel((0, 0)) == 255


def test_missing_folder_fewer_than_two_classes_and_empty_class(tmp_path, make_cfg):
    with pytest.raises(DataError, match="does not exist; set data.image_dir"):
        prepared(make_cfg, tmp_path / "nope")
    (tmp_path / "one").mkdir()
    write_digits(tmp_path / "src", limit=5)
    with pytest.raises(DataError, match="has 0 class folder"):
        prepared(make_cfg, tmp_path / "one")
    (tmp_path / "one" / "a").mkdir()
    (tmp_path / "one" / "b").mkdir()
    (tmp_path / "one" / "a" / "x.png").write_bytes((tmp_path / "src" / "0" / "digit_0000.png").read_bytes())
    with pytest.raises(DataError, match=r"one/b is empty"):
        prepared(make_cfg, tmp_path / "one")
    (tmp_path / "one" / "b" / "bad.png").write_bytes(b"")
    with pytest.raises(DataError, match="no readable image"):
        prepared(make_cfg, tmp_path / "one")


def _labelled(n_per_class: dict[str, int]) -> list[tuple[str, str]]:
    items, i = [], 0
    for label, n in n_per_class.items():
        for _ in range(n):
            items.append((hashlib.sha256(str(i).encode()).hexdigest(), label))
            i += 1
    return items


def test_split_is_deterministic_and_depends_on_the_seed():
    items = _labelled({"a": 1000, "b": 1000})
    a = assign_splits(items, 42, 0.15, 0.15)
    assert a == assign_splits(list(reversed(items)), 42, 0.15, 0.15)  # not the scan order
    assert a != assign_splits(items, 7, 0.15, 0.15)
    counts = Counter(a.values())
    assert counts == {"test": 300, "val": 300, "train": 1400}


def test_split_is_stratified_per_class(tmp_path):
    """Each class's share of each split is its param share, to one image (a hash-only
    split is off by about sqrt(n p (1-p)), ~5 images per digit class here), even for
    very unequal classes."""
    write_digits(tmp_path / "all")
    items = content_labels(tmp_path / "all")
    items += _labelled({"rare": 7, "huge": 3000})
    for val, test in ((0.15, 0.15), (0.1, 0.25)):
        splits = assign_splits(items, 42, val, test)
        per_class = Counter((label, splits[sha]) for sha, label in items)
        labels = Counter(label for _, label in items)
        for cls, n in labels.items():
            for s, share in (("test", test), ("val", val), ("train", 1 - val - test)):
                assert per_class[(cls, s)] >= 1, (cls, s)
                assert abs(per_class[(cls, s)] - n * share) <= 1, (cls, s, per_class[(cls, s)], n)


def test_split_is_stable_when_files_are_added(tmp_path):
    """Adding one file moves at most 2 other files (one across each split boundary), all
    in its own class; adding k files moves at most 2k."""
    write_digits(tmp_path / "all")
    items = content_labels(tmp_path / "all")
    label_of = dict(items)
    before = assign_splits(items[:900], 42, 0.15, 0.15)
    for k in range(900, 1100):
        after = assign_splits(items[: k + 1], 42, 0.15, 0.15)
        moved = [sha for sha in before if after[sha] != before[sha]]
        assert len(moved) <= 2, (k, len(moved))
        assert all(label_of[sha] == items[k][1] for sha in moved)
        before = after
    first = assign_splits(items[:900], 42, 0.15, 0.15)
    full = assign_splits(items, 42, 0.15, 0.15)
    moved = sum(full[sha] != split for sha, split in first.items())
    assert moved <= 2 * (len(items) - 900)
    assert moved < 0.1 * 900, moved  # in practice far fewer: most files keep their split


def test_identical_images_share_a_split_across_classes():
    items = _labelled({"a": 50, "b": 50})
    items += [(sha, "b") for sha, label in items[:50]]  # class a's bytes again under b
    splits = assign_splits(items, 42, 0.2, 0.2)
    assert set(splits) == {sha for sha, _ in items}  # one split per content


@pytest.mark.parametrize("n, expected", [(1, (0, 0)), (2, (0, 1)), (3, (1, 2)), (4, (1, 2)),
                                         (7, (1, 2)), (10, (2, 3)), (100, (15, 30))])
def test_split_bounds_reach_every_split_from_three_images(n, expected):
    assert split_bounds(n, 0.15, 0.15) == expected
    b1, b2 = split_bounds(n, 0.15, 0.15)
    assert (b1, b2) == tuple(sorted((b1, b2)))
    for m in range(1, 400):  # each bound grows by at most one per added image
        lo, hi = split_bounds(m, 0.15, 0.15), split_bounds(m + 1, 0.15, 0.15)
        assert 0 <= hi[0] - lo[0] <= 1 and 0 <= hi[1] - lo[1] <= 1


# ------------------------------------------------ what counts as a class's file (item 8)

def _png(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (6, 6), value).save(path)


def test_symlinks_out_of_the_folder_are_refused_never_read(tmp_path, make_cfg):
    root = tmp_path / "imgs"
    _png(root / "a" / "one.png")
    _png(root / "b" / "two.png", 255)
    _png(tmp_path / "secret" / "outside.png", 7)
    (root / "a" / "leak.png").symlink_to(tmp_path / "secret" / "outside.png")
    (root / "a" / "dir_leak").symlink_to(tmp_path / "secret")
    (root / "b" / "inside.png").symlink_to(root / "a" / "one.png")  # stays in the folder
    (root / "b" / "subdir_link").symlink_to(root / "a")
    (root / "b" / "dangling.png").symlink_to(root / "gone.png")
    classes, files, refused = list_files(root)
    assert classes == ["a", "b"]
    assert [(p.relative_to(root).as_posix(), c) for p, c in files] == [
        ("a/one.png", "a"), ("b/inside.png", "b"), ("b/two.png", "b")]
    reasons = {b.path.relative_to(root).as_posix(): b.reason for b in refused}
    assert reasons == {
        "a/leak.png": "symlink leading outside data.image_dir: not followed",
        "a/dir_leak": "symlink leading outside data.image_dir: not followed",
        "b/subdir_link": "symlink to a folder: not followed (link the files, or move the folder)",
        "b/dangling.png": "broken symlink: its target does not exist",
    }
    _, good, bad = prepared(make_cfg, root)
    assert set(good) == {"a/one.png", "b/two.png", "b/inside.png"}
    assert set(bad) == set(reasons)


def test_a_class_folder_linked_from_outside_is_refused(tmp_path):
    root = tmp_path / "imgs"
    _png(root / "a" / "one.png")
    _png(tmp_path / "elsewhere" / "x.png")
    (root / "b").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DataError, match=r"class folder .*/b is a symlink to .*elsewhere, outside"):
        list_files(root)


def test_nested_files_take_the_top_folder_and_hidden_names_are_ignored(tmp_path):
    root = tmp_path / "imgs"
    _png(root / "cat" / "2024" / "june" / "a.png")
    _png(root / "cat" / "b.png")
    _png(root / "dog" / "c.png")
    _png(root / "dog" / ".ipynb_checkpoints" / "c-checkpoint.png")
    (root / "dog" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    _png(root / ".thumbnails" / "t.png")  # a hidden folder at the top is no class either
    classes, files, refused = list_files(root)
    assert classes == ["cat", "dog"]
    assert [(p.relative_to(root).as_posix(), c) for p, c in files] == [
        ("cat/2024/june/a.png", "cat"), ("cat/b.png", "cat"), ("dog/c.png", "dog")]
    assert refused == []
    _png(root / "bird" / ".hidden.png")  # only hidden files: an empty class
    with pytest.raises(DataError, match=r"imgs/bird is empty"):
        list_files(root)


def test_a_class_folder_name_that_is_not_utf8_is_refused_naming_it(tmp_path):
    root = tmp_path / "imgs"
    _png(root / "a" / "one.png")
    bad = os.fsencode(root) + b"/caf\xe9"
    os.mkdir(bad)
    _png(Path(os.fsdecode(bad)) / "x.png")
    with pytest.raises(DataError, match=r"class folder b'caf\\xe9' in .*imgs is not a valid UTF-8"):
        list_files(root)
