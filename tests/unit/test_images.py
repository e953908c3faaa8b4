"""Validation quarantines each kind of bad file; the split is stable and stratified."""

from collections import Counter

import pytest
from PIL import Image

from images import mixed_folder
from tfmlops.data.builtin import write_digits
from tfmlops.data.images import assign_split, scan
from tfmlops.errors import DataError


def test_each_bad_kind_is_quarantined_with_its_reason(tmp_path):
    expected = mixed_folder(tmp_path / "imgs")
    classes, good, bad = scan(tmp_path / "imgs", channels=1)
    assert classes == ["0", "1", "2"]
    reasons = {str(b.path.relative_to(tmp_path / "imgs")): b.reason for b in bad}
    assert set(reasons) == set(expected)
    for rel, reason in expected.items():
        assert reasons[rel].startswith(reason), (rel, reasons[rel])
    assert len(good) == 36


@pytest.mark.parametrize("channels, mode", [(1, "L"), (3, "RGB")])
def test_every_good_image_is_converted_to_the_channel_count(tmp_path, channels, mode):
    import io

    mixed_folder(tmp_path / "imgs", per_class=5)
    _, good, _ = scan(tmp_path / "imgs", channels=channels)
    sources = Counter(g.path.suffix.lower() for g in good)
    assert {".jpg", ".png", ".bmp", ".gif"} <= set(sources)
    for g in good:
        assert Image.open(io.BytesIO(g.png)).mode == mode


def test_transparent_pixels_become_white_not_black(tmp_path):
    import io

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(tmp_path / "a" / "clear.png")
    Image.new("L", (4, 4), 0).save(tmp_path / "b" / "black.png")
    _, good, _ = scan(tmp_path, channels=1)
    clear = next(g for g in good if g.label == "a")
    assert Image.open(io.BytesIO(clear.png)).getpixel((0, 0)) == 255


def test_missing_folder_fewer_than_two_classes_and_empty_class(tmp_path):
    with pytest.raises(DataError, match="does not exist; set data.image_dir"):
        scan(tmp_path / "nope", 1)
    (tmp_path / "one").mkdir()
    write_digits(tmp_path / "src", limit=5)
    with pytest.raises(DataError, match="has 0 class folder"):
        scan(tmp_path / "one", 1)
    (tmp_path / "one" / "a").mkdir()
    (tmp_path / "one" / "b").mkdir()
    (tmp_path / "one" / "a" / "x.png").write_bytes((tmp_path / "src" / "0" / "digit_0000.png").read_bytes())
    with pytest.raises(DataError, match=r"one/b is empty"):
        scan(tmp_path / "one", 1)
    (tmp_path / "one" / "b" / "bad.png").write_bytes(b"")
    with pytest.raises(DataError, match="no readable image"):
        scan(tmp_path / "one", 1)


def test_split_is_deterministic_and_depends_on_the_seed():
    hashes = [f"{i:064x}" for i in range(2000)]
    a = [assign_split(h, 42, 0.15, 0.15) for h in hashes]
    assert a == [assign_split(h, 42, 0.15, 0.15) for h in hashes]
    b = [assign_split(h, 7, 0.15, 0.15) for h in hashes]
    assert a != b
    counts = Counter(a)
    assert abs(counts["test"] / 2000 - 0.15) < 0.03 and abs(counts["val"] / 2000 - 0.15) < 0.03


def test_split_is_stable_when_files_are_added(tmp_path):
    write_digits(tmp_path / "all")
    _, good, _ = scan(tmp_path / "all", 1)
    first = {g.path.name: assign_split(g.sha256, 42, 0.15, 0.15) for g in good[:900]}
    after = {g.path.name: assign_split(g.sha256, 42, 0.15, 0.15) for g in good}
    assert all(after[name] == split for name, split in first.items())


def test_split_is_stratified_per_class(tmp_path):
    write_digits(tmp_path / "all")
    _, good, _ = scan(tmp_path / "all", 1)
    per_class = Counter((g.label, assign_split(g.sha256, 42, 0.15, 0.15)) for g in good)
    for cls in map(str, range(10)):
        n = sum(per_class[(cls, s)] for s in ("train", "val", "test"))
        for s, share in (("test", 0.15), ("val", 0.15)):
            assert per_class[(cls, s)] > 0
            assert abs(per_class[(cls, s)] / n - share) < 0.09, (cls, s, per_class[(cls, s)], n)
