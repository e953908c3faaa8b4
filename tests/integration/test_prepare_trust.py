"""prepare's trust in its cache and memo: an incremental run writes what a cold one
writes, and every manifest row names its own file's content and label."""

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from images import photo_folder
from tfmlops.artifacts import MANIFEST, RUN_FILE
from tfmlops.stages import prepare

PAST = 1_700_000_000  # older than the memo's "too recent to trust" window


def trust_cfg(make_cfg, work: Path, folder: Path, **data):
    work.mkdir(parents=True, exist_ok=True)
    data = {"image_dir": str(folder), "channels": 3, "image_size": 16,
            "split": {"val": 0.2, "test": 0.2}, **data}
    return make_cfg(work, data=data, tracking={"enabled": False})


def prepared_bytes(cfg) -> dict[str, bytes]:
    """Every file under paths.prepared, by relative path; the manifest without image_dir."""
    out = Path(cfg.paths.prepared)
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    files.pop(RUN_FILE, None)
    manifest = json.loads(files[MANIFEST])
    manifest.pop("image_dir")
    files[MANIFEST] = json.dumps(manifest, sort_keys=True).encode()
    return files


def assert_rows_match_files(cfg) -> None:
    """Each manifest row's hash is its file's, its label the file's class folder."""
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    root = Path(cfg.data.image_dir)
    for row in manifest["files"]:
        path = root / row["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"], row
        assert Path(row["file"]).parts[0] == row["label"], row


def age(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            os.utime(p, (PAST, PAST))


def test_a_duplicate_and_a_new_image_size_give_the_cold_bytes(tmp_path, make_cfg):
    """The two-step report: one photo saved twice, prepare at 16 px, then at 20 px. The
    second run took its cache-or-decode decision twice per file and shifted the pool's
    results onto the files after the duplicate (other files' hashes, other labels)."""
    files = photo_folder(tmp_path / "photos", per_class=7)
    shutil.copy(files[2], tmp_path / "photos" / "c0" / "again.jpg")
    age(tmp_path / "photos")
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=2)
    prepare.run(warm)
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=2, image_size=20)
    prepare.run(warm)
    assert_rows_match_files(warm)
    cold = trust_cfg(make_cfg, tmp_path / "cold", tmp_path / "photos", workers=1, image_size=20)
    prepare.run(cold)
    assert prepared_bytes(warm) == prepared_bytes(cold)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_duplicate_after_a_changed_spec_in_process_and_pool(tmp_path, make_cfg, workers):
    """Same, with the duplicate in another class and the store encoding changed."""
    files = photo_folder(tmp_path / "photos", per_class=5)
    shutil.copy(files[0], tmp_path / "photos" / "c2" / "dup.jpg")
    age(tmp_path / "photos")
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=workers)
    prepare.run(warm)
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=workers,
                     store={"encoding": "png"})
    prepare.run(warm)
    assert_rows_match_files(warm)
    cold = trust_cfg(make_cfg, tmp_path / "cold", tmp_path / "photos", workers=1,
                     store={"encoding": "png"})
    prepare.run(cold)
    assert prepared_bytes(warm) == prepared_bytes(cold)


def test_a_duplicate_across_two_classes_is_kept_under_each_label_and_warned(tmp_path, make_cfg,
                                                                           caplog):
    """The policy: identical bytes in two class folders stay, each copy under its own
    folder's label, both in one split (no leakage), with one warning line naming a pair."""
    import logging

    files = photo_folder(tmp_path / "photos", per_class=5, classes=2)
    shutil.copy(files[0], tmp_path / "photos" / "c1" / "same.jpg")
    cfg = trust_cfg(make_cfg, tmp_path / "run", tmp_path / "photos", workers=1)
    with caplog.at_level(logging.WARNING, logger="tfmlops"):
        prepare.run(cfg)
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    rows = {r["file"]: r for r in manifest["files"]}
    a, b = rows["c0/" + files[0].name], rows["c1/same.jpg"]
    assert a["sha256"] == b["sha256"] and (a["label"], b["label"]) == ("c0", "c1")
    assert a["split"] == b["split"]
    (line,) = [r.getMessage() for r in caplog.records if "more than one class folder" in r.getMessage()]
    assert f"c0/{files[0].name} and c1/same.jpg" in line
    assert_rows_match_files(cfg)


def test_a_result_about_another_file_stops_the_run(tmp_path, make_cfg, monkeypatch):
    """The join checks each pool result names the file it is joined to."""
    from tfmlops.errors import DataError
    from tfmlops.stages.prepare import stream

    photo_folder(tmp_path / "photos", per_class=4, classes=2)
    cfg = trust_cfg(make_cfg, tmp_path / "run", tmp_path / "photos", workers=1)
    real = stream._decode_all

    def swapped(paths, spec, pool, chunk=8):
        results = list(real(paths, spec, pool, chunk))
        results[1], results[2] = results[2], results[1]
        yield from results

    monkeypatch.setattr(stream, "_decode_all", swapped)
    with pytest.raises(DataError) as err:
        prepare.run(cfg)
    assert "came back for" in str(err.value) and len(str(err.value).splitlines()) == 1
    assert not Path(cfg.paths.prepared).exists()


def test_a_same_size_rewrite_with_its_old_mtime_is_hashed_again(tmp_path, make_cfg):
    """What the search found when the memo keyed on (size, mtime, inode) alone: one
    byte of a file changed in place and its old mtime put back (`cp -p` over it) kept
    the old hash, so the old image was written under the file's name."""
    files = photo_folder(tmp_path / "photos", per_class=5, classes=2)
    age(tmp_path / "photos")
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=1)
    prepare.run(warm)
    target = files[3]
    old = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with target.open("r+b") as fh:  # in place: same inode, same size
        fh.write(bytes(data))
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (target.stat().st_ino, target.stat().st_size, target.stat().st_mtime_ns) == (
        old.st_ino, old.st_size, old.st_mtime_ns)
    prepare.run(warm)
    assert_rows_match_files(warm)
    cold = trust_cfg(make_cfg, tmp_path / "cold", tmp_path / "photos", workers=1)
    prepare.run(cold)
    assert prepared_bytes(warm) == prepared_bytes(cold)


def _damage_bytes(blob: bytearray) -> None:
    """Flip a byte in the first entry's image bytes: its header intact, so it is indexed
    as usable, and found only when its record is written."""
    n, _crc = struct.unpack_from("<II", blob, 0)  # the entry: header, then its bytes
    blob[8 + n + json.loads(bytes(blob[8 : 8 + n]))["length"] // 2] ^= 0xFF


def _damage_hash_field(blob: bytearray) -> None:
    """The long search's find: one flipped byte in an entry's sha256 field (no longer
    hex) crashed every later prepare; now the entry is skipped and its file decoded."""
    blob[blob.index(b'"sha256": "') + len(b'"sha256": "') + 5] = ord("?")


@pytest.mark.parametrize("damage", [_damage_bytes, _damage_hash_field])
def test_a_damaged_cache_entry_is_decoded_again_once_and_cached(tmp_path, make_cfg, damage):
    """The file is decoded again, the output is a cold run's, and the new entry serves
    the next run."""
    photo_folder(tmp_path / "photos", per_class=4, classes=2)
    age(tmp_path / "photos")
    warm = trust_cfg(make_cfg, tmp_path / "warm", tmp_path / "photos", workers=1)
    prepare.run(warm)
    (seg,) = Path(warm.paths.prepare_cache).glob("*/*.seg")
    blob = bytearray(seg.read_bytes())
    damage(blob)
    seg.write_bytes(bytes(blob))
    assert prepare.run(warm)["images_decoded"] == 1
    assert_rows_match_files(warm)
    cold = trust_cfg(make_cfg, tmp_path / "cold", tmp_path / "photos", workers=1)
    prepare.run(cold)
    assert prepared_bytes(warm) == prepared_bytes(cold)
    assert prepare.run(warm)["images_decoded"] == 0
