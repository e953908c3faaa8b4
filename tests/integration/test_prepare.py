"""The prepare stage on messy real images, tracked in a real MLflow store."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import child_env, mlflow_client, stage_runs
from images import bomb_png, exif_rotated_jpeg, mixed_folder, mpo_jpeg, photo, photo_folder, sixteen_bit_png
from tfmlops import profiling
from tfmlops.artifacts import (
    DATA_VERSION,
    MANIFEST,
    QUARANTINE,
    RUN_FILE,
    STATS,
    TAG_DATA_VERSION,
    TAG_STAGE,
    run_dir,
)
from tfmlops.errors import DataError
from tfmlops.stages import prepare
from tfmlops.stages.materialize.builtin import write_digits
from tfmlops.tracking.lineage import wait_delivered


def test_mixed_folder_with_broken_files(tmp_path, make_cfg):
    expected_bad = mixed_folder(tmp_path / "own")
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "channels": 3,
                         "max_bad_fraction": 0.2, "split": {"val": 0.2, "test": 0.2}})
    metrics = prepare.run(cfg)
    assert metrics["images_bad"] == len(expected_bad) == 5
    assert metrics["images_good"] == 36
    assert metrics["train_images"] + metrics["val_images"] + metrics["test_images"] == 36

    out = Path(cfg.paths.prepared)
    quarantine = json.loads((out / QUARANTINE).read_text())
    assert {q["file"] for q in quarantine} == set(expected_bad)
    for q in quarantine:  # a copy sits beside the report; the user's folder is untouched
        assert (out / "quarantine" / q["file"]).exists() and (tmp_path / "own" / q["file"]).exists()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["channels"] == 3 and manifest["classes"] == ["0", "1", "2"]
    stats = json.loads((out / STATS).read_text())
    assert len(stats["mean"]) == len(stats["std"]) == 3
    assert json.loads((Path(cfg.paths.reports) / "prepare.json").read_text()) == metrics


def test_run_holds_params_metrics_tags_and_dataset_input(tmp_path, make_cfg):
    mixed_folder(tmp_path / "own", per_class=10)
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.25,
                         "split": {"val": 0.2, "test": 0.2}},
                   profiling={"enabled": True, "start_step": 1, "steps": 1})
    prepare.run(cfg)
    (run,) = stage_runs(cfg, "prepare")
    assert run.info.status == "FINISHED"
    assert re.fullmatch(r"prepare-[0-9a-f]{6}", run.info.run_name)  # stage + params digest
    assert run.data.params["data.channels"] == "1"
    assert run.data.params["seed"] == str(cfg.seed)
    assert run.data.metrics["images_bad"] == 5
    tags = run.data.tags
    for tag in (TAG_STAGE, "tfmlops.params_hash", TAG_DATA_VERSION,
                "mlflow.source.git.commit", "tfmlops.git_dirty"):
        assert tag in tags
    manifest = (Path(cfg.paths.prepared) / MANIFEST).read_bytes()
    import hashlib

    assert tags[TAG_DATA_VERSION] == hashlib.sha256(manifest).hexdigest()[:16]
    (ds_input,) = run.inputs.dataset_inputs
    assert ds_input.dataset.digest == tags[TAG_DATA_VERSION]
    client = mlflow_client(cfg)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "prepared" in artifacts
    # beside the reports, not in the data (their bytes are the same whichever run made them)
    assert not (Path(cfg.paths.prepared) / RUN_FILE).exists()
    run_file = json.loads((run_dir(cfg, "prepare") / RUN_FILE).read_text())
    assert run_file["run_id"] == run.info.run_id
    assert run_file[DATA_VERSION] == tags[TAG_DATA_VERSION]


def test_prepare_as_users_run_it_imports_neither_tensorflow_nor_mlflow(tmp_path, make_cfg):
    """Issue 26: with tracking and profiling on, prepare's process loads no TensorFlow
    (its TFRecords are written directly; `train` profiles the input pipeline, which prepare
    used to cache whole to profile: 1.3 GB at 4,000 photos) and no MLflow (the tracking
    sidecar keeps the run), nor pydantic (the config is msgspec's); the run still gets the
    stage's metrics and files."""
    mixed_folder(tmp_path / "own", per_class=6)
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.5},
                   profiling={"enabled": True, "start_step": 1, "steps": 1})
    code = ("import sys\nfrom tfmlops.cli import main\n"
            f"assert main(['--params', {str(tmp_path / 'params.yaml')!r}, 'prepare']) == 0\n"
            "print(sorted(m for m in ('tensorflow', 'mlflow', 'pydantic') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    # it exited before its sidecar delivered the run: wait as a later stage does
    assert wait_delivered(run_dir(cfg, "prepare"), timeout_s=120)
    (run,) = stage_runs(cfg, "prepare")
    assert run.info.status == "FINISHED"
    assert run.data.metrics["images_good"] == 18 and "decode_seconds" in run.data.metrics
    assert {a.path for a in mlflow_client(cfg).list_artifacts(run.info.run_id)} == {"prepared",
                                                                                 "data_profile"}
    assert not profiling.profile_dir(cfg, "prepare").exists()


def test_too_many_bad_files_fail_before_any_output(tmp_path, make_cfg):
    mixed_folder(tmp_path / "own", per_class=4)  # 5 bad of 17
    cfg = make_cfg(data={"image_dir": str(tmp_path / "own"), "max_bad_fraction": 0.1})
    with pytest.raises(DataError, match=r"5 of 17 files .* data.max_bad_fraction"):
        prepare.run(cfg)
    assert not Path(cfg.paths.prepared).exists()
    assert stage_runs(cfg, "prepare") == []


# ------------------------------------------------- streaming, parallel, incremental

OUTPUTS = (MANIFEST, STATS, QUARANTINE)


def photo_cfg(make_cfg, tmp_path, folder, name="run", **data):
    """Params for prepare on `folder`, with their own output and cache folders."""
    work = tmp_path / name
    work.mkdir(exist_ok=True)
    return make_cfg(work, data={"image_dir": str(folder), "channels": 3,
                                "split": {"val": 0.2, "test": 0.2}, **data},
                    tracking={"enabled": False})


def output_bytes(cfg) -> dict[str, bytes]:
    """Every TFRecord shard and JSON output of a prepare run, by name."""
    out = Path(cfg.paths.prepared)
    names = sorted(p.name for p in out.glob("*.tfrecord")) + list(OUTPUTS)
    return {n: (out / n).read_bytes() for n in names}


def stored_images(cfg) -> dict[str, bytes]:
    """sha256 -> the image bytes stored in the TFRecords."""
    import tensorflow as tf

    files = sorted(str(p) for p in Path(cfg.paths.prepared).glob("*.tfrecord"))
    stored = {}
    for record in tf.data.TFRecordDataset(files):
        ex = tf.train.Example.FromString(record.numpy())
        stored[ex.features.feature["sha256"].bytes_list.value[0].decode()] = \
            ex.features.feature["image"].bytes_list.value[0]
    return stored


def test_parallel_and_serial_prepare_write_identical_output(tmp_path, make_cfg):
    photo_folder(tmp_path / "photos", per_class=12)
    serial = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "serial", workers=1)
    parallel = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "parallel", workers=2)
    prepare.run(serial)
    metrics = prepare.run(parallel)
    assert metrics["images_decoded"] == 36 and metrics["images_cached"] == 0
    a, b = output_bytes(serial), output_bytes(parallel)
    assert len([n for n in a if n.endswith(".tfrecord")]) == 6
    assert a == b


def test_records_are_written_in_content_hash_order_not_class_by_class(tmp_path, make_cfg):
    """A shuffle buffer smaller than the split must still see every class."""
    import tensorflow as tf

    photo_folder(tmp_path / "photos", per_class=12)
    cfg = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "order", workers=1)
    prepare.run(cfg)
    shas, labels = [], []
    for shard in sorted(Path(cfg.paths.prepared).glob("train-*.tfrecord")):
        in_shard = []
        for record in tf.data.TFRecordDataset(str(shard)):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            in_shard.append(feature["sha256"].bytes_list.value[0].decode())
            labels.append(feature["label"].int64_list.value[0])
        assert in_shard == sorted(in_shard)
        shas += in_shard
    assert len(shas) > 12 and len(set(labels)) == 3
    assert labels != sorted(labels)  # the listing's order (class by class) would be sorted


def test_stored_size_and_encoding_follow_the_params(tmp_path, make_cfg):
    import io

    from PIL import Image

    from tfmlops.data import pipeline

    photo_folder(tmp_path / "photos", per_class=8)
    auto = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "auto")
    metrics = prepare.run(auto)
    manifest = json.loads((Path(auto.paths.prepared) / MANIFEST).read_text())
    by_sha = {f["sha256"]: f["file"] for f in manifest["files"]}
    for sha, data in stored_images(auto).items():
        img = Image.open(io.BytesIO(data))
        assert min(img.size) == 16  # short side at image_size, aspect kept
        assert img.format == ("JPEG" if by_sha[sha].endswith(".jpg") else "PNG")
    stored = manifest["stored"]
    assert stored["short_side"] == 16 and stored["encoding"] == "auto"
    assert stored["encodings"] == {"jpeg": 18, "png": 6} and stored["sizes"]["width"]["min"] >= 16
    assert stored["bytes"] == metrics["stored_bytes"] < metrics["source_bytes"] / 4

    png = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "png",
                    store={"short_side": 24, "encoding": "png"})
    prepare.run(png)
    for data in stored_images(png).values():
        img = Image.open(io.BytesIO(data))
        assert img.format == "PNG" and min(img.size) == 24 and img.mode == "RGB"
    jpeg = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "jpeg",
                     store={"encoding": "jpeg", "jpeg_quality": 60})
    prepare.run(jpeg)
    assert {Image.open(io.BytesIO(d)).format for d in stored_images(jpeg).values()} == {"JPEG"}
    # the training pipeline reads what was stored, at the model's input size
    for cfg in (auto, png, jpeg):
        prepared = pipeline.load_prepared(cfg)
        x, _ = next(iter(pipeline.dataset(cfg, prepared, "train", batch_size=4)))
        assert x.shape == (4, 16, 16, 3)


@pytest.mark.parametrize("data, key", [
    ({"store": {"encoding": "webp"}}, "data.store.encoding"),
    ({"store": {"jpeg_quality": 101}}, "data.store.jpeg_quality"),
    ({"store": {"short_side": 8}}, "data.store.short_side"),
    ({"workers": -1}, "data.workers"),
])
def test_bad_store_params_exit_2_with_one_line(tmp_path, make_cfg, capsys, data, key):
    from tfmlops.cli import main

    make_cfg(tracking={"enabled": False})  # a valid params.yaml, then one bad value
    import yaml

    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    for name, value in data.items():
        if isinstance(value, dict):
            params["data"][name].update(value)
        else:
            params["data"][name] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["--params", str(tmp_path / "params.yaml"), "prepare"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err, err


def test_incremental_prepare_equals_a_cold_one(tmp_path, make_cfg):
    files = photo_folder(tmp_path / "photos", per_class=12)
    warm = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "warm", workers=2)
    first = prepare.run(warm)
    assert (first["images_decoded"], first["images_cached"]) == (36, 0)
    again = prepare.run(warm)
    assert (again["images_decoded"], again["images_cached"]) == (0, 36)

    # add two, remove one, change one; one more bad file too
    rng = np.random.default_rng(5)
    photo(rng, 70, 50, 0.2).save(tmp_path / "photos" / "c0" / "new1.jpg")
    photo(rng, 50, 70, 0.8).save(tmp_path / "photos" / "c2" / "new2.png")
    files[5].unlink()
    photo(rng, 60, 60, 0.5).save(files[20], format="JPEG")
    (tmp_path / "photos" / "c1" / "broken.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * 40)
    metrics = prepare.run(warm)
    assert (metrics["images_decoded"], metrics["images_cached"]) == (4, 34)

    cold = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "cold", workers=1)
    assert prepare.run(cold)["images_decoded"] == 38
    warm_out, cold_out = output_bytes(warm), output_bytes(cold)
    assert warm_out.keys() == cold_out.keys()
    for name in warm_out:
        assert warm_out[name] == cold_out[name] or name == MANIFEST, name
    strip = lambda m: {k: v for k, v in json.loads(m).items() if k != "image_dir"}  # noqa: E731
    assert strip(warm_out[MANIFEST]) == strip(cold_out[MANIFEST])
    assert json.loads(warm_out[QUARANTINE])[0]["file"] == "c1/broken.jpg"
    # a second unchanged run decodes nothing, and the cache holds one entry per file
    assert prepare.run(warm)["images_decoded"] == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_unchanged_files_are_not_read_again_to_hash(tmp_path, make_cfg, workers):
    files = photo_folder(tmp_path / "photos", per_class=6)
    past = 1_700_000_000
    for f in files:  # older than the memo's racy window (files written now are hashed again)
        os.utime(f, (past, past))
    cfg = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", workers=workers)
    first = prepare.run(cfg)
    assert first["files_hashed"] == 18
    again = prepare.run(cfg)
    assert (again["files_hashed"], again["images_decoded"]) == (0, 0)
    # touched and copied (same content, new stat or path): hashed again, found in the cache
    os.utime(files[0], (past + 5, past + 5))
    (tmp_path / "photos" / "c1" / "copy.jpg").write_bytes(files[1].read_bytes())
    os.utime(tmp_path / "photos" / "c1" / "copy.jpg", (past, past))
    same = prepare.run(cfg)
    assert (same["files_hashed"], same["images_decoded"], same["images_cached"]) == (2, 0, 19)
    (tmp_path / "photos" / "c1" / "copy.jpg").unlink()

    # new content of the same size, mtime moved on: hashed again, and so decoded again
    data = bytearray(files[3].read_bytes())
    data[-3] ^= 0x01
    files[3].write_bytes(bytes(data))
    os.utime(files[3], (past + 10, past + 10))
    changed = prepare.run(cfg)
    assert (changed["files_hashed"], changed["images_decoded"]) == (1, 1)
    photo(np.random.default_rng(1), 40, 30, 0.3).save(tmp_path / "photos" / "c0" / "fresh.jpg")
    assert prepare.run(cfg)["files_hashed"] == 1  # the new file only: files[3] was remembered

    cold = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", "cold", workers=1)
    prepare.run(cold)
    strip = lambda m: {k: v for k, v in json.loads(m).items() if k != "image_dir"}  # noqa: E731
    assert strip(output_bytes(cfg)[MANIFEST]) == strip(output_bytes(cold)[MANIFEST])
    assert output_bytes(cfg).keys() == output_bytes(cold).keys()  # no file left over


def test_phone_photos_are_read_as_phones_write_them(tmp_path, make_cfg):
    import io

    from PIL import Image

    root = tmp_path / "phone"
    photo_folder(root, per_class=6, classes=2)
    upright = exif_rotated_jpeg(root / "c0" / "portrait.jpg", 60, 30)
    values = sixteen_bit_png(root / "c1" / "deep.png")
    mpo_jpeg(root / "c1" / "phone.jpg")
    bomb_png(root / "c0" / "bomb.png")
    cfg = photo_cfg(make_cfg, tmp_path, root, max_bad_fraction=0.2,
                    split={"val": 0.1, "test": 0.1}, store={"short_side": 20})
    prepare.run(cfg)
    (bad,) = json.loads((Path(cfg.paths.prepared) / QUARANTINE).read_text())
    assert bad["file"] == "c0/bomb.png" and bad["reason"].startswith("decompression bomb")
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    sha = {f["file"]: f["sha256"] for f in manifest["files"]}
    stored = stored_images(cfg)
    portrait = Image.open(io.BytesIO(stored[sha["c0/portrait.jpg"]]))
    assert upright.size == (30, 60) and portrait.size == (20, 40)  # turned upright, then reduced
    deep = np.asarray(Image.open(io.BytesIO(stored[sha["c1/deep.png"]])).convert("L"), np.float64)
    assert deep.max() >= 250 and deep.min() <= 5  # scaled to 8 bits, not clipped to white
    assert abs(deep.mean() - values.mean() / 257) < 3
    assert Image.open(io.BytesIO(stored[sha["c1/phone.jpg"]])).size == (25, 20)


def test_a_failed_run_leaves_the_previous_output_and_no_staging(tmp_path, make_cfg):
    photo_folder(tmp_path / "photos", per_class=6)
    cfg = photo_cfg(make_cfg, tmp_path, tmp_path / "photos", max_bad_fraction=0.1)
    prepare.run(cfg)
    before = output_bytes(cfg)
    for i in range(4):
        (tmp_path / "photos" / "c0" / f"bad{i}.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="unusable"):
        prepare.run(cfg)
    assert output_bytes(cfg) == before
    assert [p.name for p in Path(cfg.paths.prepared).parent.iterdir()
            if p.name.startswith(".")] == []


def _distinct_pngs(folder: Path, n: int, offset: int = 0) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("L", (8, 8), (offset + i * 7) % 256).save(folder / f"img{i:02d}.png")


def test_symlink_out_of_image_dir_is_quarantined_not_copied(tmp_path, make_cfg):
    root = tmp_path / "own"
    _distinct_pngs(root / "a", 12)
    _distinct_pngs(root / "b", 12, offset=100)
    _distinct_pngs(tmp_path / "private", 1, offset=50)
    (root / "a" / "leak.png").symlink_to(tmp_path / "private" / "img00.png")
    cfg = make_cfg(data={"image_dir": str(root), "max_bad_fraction": 0.2},
                   tracking={"enabled": False})
    metrics = prepare.run(cfg)
    assert metrics["images_good"] == 24 and metrics["images_bad"] == 1
    out = Path(cfg.paths.prepared)
    quarantine = json.loads((out / QUARANTINE).read_text())
    assert quarantine == [{"file": "a/leak.png", "label": "a",
                           "reason": "symlink leading outside data.image_dir: not followed"}]
    # its bytes are never read nor copied into the quarantine (a DVC output)
    assert not [p for p in out.rglob("*") if p.is_file() and "quarantine/" in p.as_posix()]


def test_a_class_too_small_for_every_split_errors_or_warns(tmp_path, make_cfg, caplog):
    root = tmp_path / "own"
    _distinct_pngs(root / "a", 12)
    _distinct_pngs(root / "b", 2, offset=100)  # 2 images cannot reach train, val and test
    cfg = make_cfg(data={"image_dir": str(root)}, tracking={"enabled": False})
    with pytest.raises(DataError, match=r"class 'b' is missing from a split \(train 1, val 1, "
                                        r"test 0\).*data.split.too_few: warn"):
        prepare.run(cfg)
    assert not Path(cfg.paths.prepared).exists()
    cfg = make_cfg(data={"image_dir": str(root), "split": {"too_few": "warn"}},
                   tracking={"enabled": False})
    prepare.run(cfg)
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    assert manifest["class_counts"]["test"] == {"a": 2, "b": 0}
    assert any(r.levelname == "WARNING" and "class 'b' is missing from a split" in r.message
               for r in caplog.records)
    _distinct_pngs(root / "b", 3, offset=100)  # a third image: every split has one
    for i in range(3):  # unreadable files take no split's place, whatever their hash
        (root / "b" / f"broken{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes([i]) * 40)
    cfg = make_cfg(data={"image_dir": str(root), "max_bad_fraction": 0.2},
                   tracking={"enabled": False})
    prepare.run(cfg)
    manifest = json.loads((Path(cfg.paths.prepared) / MANIFEST).read_text())
    assert all(manifest["class_counts"][s]["b"] == 1 for s in ("train", "val", "test"))
    assert manifest["quarantined"] == 3


def test_a_class_folder_name_not_utf8_exits_2_naming_it(tmp_path, make_cfg, capsys):
    import os

    from tfmlops.cli import main

    root = tmp_path / "own"
    _distinct_pngs(root / "a", 4)
    bad = Path(os.fsdecode(os.fsencode(root) + b"/\xff\xfeclass"))
    _distinct_pngs(bad, 4, offset=100)
    make_cfg(data={"image_dir": str(root)}, tracking={"enabled": False})
    assert main(["--params", str(tmp_path / "params.yaml"), "prepare"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "class folder b'\\xff\\xfeclass'" in err and "not a valid UTF-8 name" in err


def test_prepare_fits_workers_and_shards_to_this_machine_in_one_line(tmp_path, make_cfg):
    """data.workers 32 and data.shards 400 (1,264 open files): params a 16-core
    workstation takes, valid here too (test_config_rules.py). On these 2 cores with a
    hard limit of 100 open files, prepare decodes with 4 processes, keeps at most 12
    shard files open per split (its 200 images fill more than 100 shards), says both in
    one warning line, and writes the bytes of a run that held every shard open."""
    import resource

    write_digits(tmp_path / "digits", limit=200)

    def prepare_in(name: str, limit: int) -> tuple[subprocess.CompletedProcess, dict]:
        (tmp_path / name).mkdir()
        cfg = make_cfg(tmp_path / name, data={"image_dir": str(tmp_path / "digits"),
                                              "workers": 32, "shards": 400},
                       tracking={"enabled": False})
        proc = subprocess.run(
            [sys.executable, "-m", "tfmlops", "--params", str(tmp_path / name / "params.yaml"),
             "prepare"], cwd=tmp_path / name, env=child_env(), capture_output=True, text=True,
            timeout=300, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                               (limit, limit)))
        return proc, (output_bytes(cfg) if proc.returncode == 0 else {})

    small, fitted = prepare_in("small", 100)
    assert small.returncode == 0, small.stderr
    (line,) = [x for x in small.stderr.splitlines() if "this machine" in x]
    assert ("fitted to this machine: data.workers 32 -> 4 processes (2 cores)" in line
            and "data.shards 400 written with at most 12 open per split" in line
            and "the output is the same" in line), line
    assert "200 to read with 4 process(es)" in small.stderr, small.stderr
    big, full = prepare_in("big", 4096)
    assert big.returncode == 0, big.stderr
    assert "data.shards" not in big.stderr, big.stderr
    assert sum(n.endswith(".tfrecord") for n in fitted) > 100  # more than could be open
    assert fitted == full
