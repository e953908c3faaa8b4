"""The skew report's sample of original files: every EXIF-rotated file it picks is
named as rotated, however many rotated files the folder has (the pixel pair leaves them
out: the SavedModel's graph does not read EXIF)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from tfmlops.stages.export.skew import EXIF_ORIENTATION, _orientation, sample_sources


def _folder(root: Path, images: int, rotated_every: int) -> dict:
    rows = []
    for i in range(images):
        name = f"c{i % 2}/img_{i:03d}.jpg"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        exif = Image.Exif()
        if i % rotated_every == 0:
            exif[EXIF_ORIENTATION] = 6
        Image.new("RGB", (12, 8), (i, 2 * i % 256, 90)).save(path, exif=exif)
        rows.append({"file": name})
    return {"image_dir": str(root), "files": rows}


def test_every_rotated_file_in_the_sample_is_named_rotated(tmp_path):
    # 60 files, 30 rotated: far more than the sample's cap of rotated ones (limit // 4)
    manifest = _folder(tmp_path, 60, rotated_every=2)
    for limit in (4, 8, 20):
        files, rotated = sample_sources(manifest, limit)
        assert 0 < len(files) <= limit
        turned = {f for f in files if _orientation(f) not in (None, 1)}
        assert turned == rotated, (limit, sorted(turned - rotated))
        assert 1 <= len(rotated) <= max(1, limit // 4)


def test_a_folder_without_rotated_files_samples_upright_ones(tmp_path):
    manifest = _folder(tmp_path, 30, rotated_every=1000)  # only img_000 is rotated
    files, rotated = sample_sources(manifest, 10)
    assert rotated == {str(tmp_path / "c0/img_000.jpg")}
    assert len(files) == 10 and len(set(files)) == 10
