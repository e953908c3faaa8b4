"""prepare on Apache Beam: the driver holds no per-file list (issue 52). The job graph
the driver builds and submits (every transform, with its pickled functions, arguments
and `beam.Create` values) names the class folders, never a file: the workers list
them. Before, `beam.Create` received every (path, class), so the graph, and the
driver, grew with the files (BENCHMARKS.md, "Prepare": the driver's peak RSS)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.mark.parametrize("url", [False, True])
def test_the_job_graph_names_the_class_folders_never_a_file(make_cfg, tmp_path, url):
    import apache_beam as beam
    from apache_beam.transforms.core import Create

    from tfmlops.stages.prepare.beam import build_pipeline, pipeline_options
    from tfmlops.stages.prepare.images import list_classes

    root = tmp_path / "images"
    for cls in ("ants", "bees"):
        (root / cls / "nested").mkdir(parents=True)
        for i in range(200):  # never read: the graph is built, not run
            (root / cls / ("nested" if i % 2 else "") / f"only-listed-{i:04d}.png").write_bytes(b"")
    image_dir = "s3://bucket/images" if url else root
    cfg = make_cfg(data={"engine": "beam", "image_dir": str(image_dir),
                         "beam": {"options": ["--runner=DirectRunner"]}})
    classes = None if url else list_classes(root)
    p = beam.Pipeline(options=pipeline_options(cfg))
    build_pipeline(p, cfg, image_dir, classes, str(tmp_path / "staging" / "run"))

    created = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, Create):
                created.extend(node.transform.values)

        enter_composite_transform = visit_transform

    p.visit(Visitor())
    # the class folders (or the URL) and the class names; Beam's own Creates hold None
    folders = [(str(image_dir), None)] if url else [(str(root), c) for c in classes]
    assert [v for v in created if v is not None] == folders + (classes or [])
    graph = job_bytes(p)
    assert b"only-listed-" not in graph  # no file's name anywhere in the job
    assert (b"s3://bucket/images" if url else b"ants") in graph  # what it holds instead


def job_bytes(p) -> bytes:
    """The job graph as the runner receives it, each transform's pickled function (its
    arguments, a Create's values) unpacked from Beam's base64 of a compressed pickle."""
    import base64
    import bz2
    import zlib

    from apache_beam.portability.api import beam_runner_api_pb2 as api

    proto = p.to_runner_api()
    out = [proto.SerializeToString()]
    for t in proto.components.transforms.values():
        fn = {"beam:transform:pardo:v1": lambda b: api.ParDoPayload.FromString(b).do_fn,
              "beam:transform:combine_per_key:v1":
                  lambda b: api.CombinePayload.FromString(b).combine_fn,
              "beam:transform:combine_globally:v1":
                  lambda b: api.CombinePayload.FromString(b).combine_fn}.get(t.spec.urn)
        if fn is None:
            continue
        packed = base64.b64decode(fn(t.spec.payload).payload)
        for unpack in (zlib.decompress, bz2.decompress):
            try:
                out.append(unpack(packed))
                break
            except (zlib.error, OSError, ValueError):
                continue
        else:
            raise AssertionError(f"{t.unique_name}: a payload this test cannot read")
    return b"\n".join(out)


@pytest.mark.distributed
@pytest.mark.slow
def test_the_folded_profile_leakage_and_warnings_are_the_local_engines(tmp_path):
    """What the combiners and the single-worker steps fold (the profile's histograms, the
    train split's exact sums, the leakage search, the cross-class warning, the refused
    files' order) is the local engine's: data/prepared and reports/data_profile.json
    byte for byte, the same warning lines, on a folder with near-duplicates that land in
    different splits, a photo in two classes and two links out of the folder."""
    import shutil

    from PIL import Image
    from test_beam import IN_PROCESS, prepared_bytes

    from conftest import run_cli, tiny_params
    from images import photo_folder
    from tfmlops.config import load_config

    root = tmp_path / "photos"
    files = photo_folder(root, per_class=10, classes=2, seed=5)
    for f in (f for f in files if f.suffix == ".png"):  # the same pixels, other bytes
        for level in (1, 2, 3):
            Image.open(f).save(f.parent / f"{f.stem}-{level}.png", compress_level=level)
    shutil.copy(files[3], root / "c1" / "in_both.jpg")
    for name in ("z.jpg", "a.jpg"):
        (root / "c0" / name).symlink_to(files[0].parent.parent.parent / "nowhere.jpg")
    outputs, warnings = [], []
    for engine in ("local", "beam"):
        work = tmp_path / engine
        work.mkdir()
        params = tiny_params(work, tracking={"enabled": False}, data={
            "image_dir": str(root), "channels": 3, "image_size": 16, "shards": 2,
            "max_bad_fraction": 0.3, "engine": engine, "beam": {"options": IN_PROCESS},
            "contract": {"leakage": {"severity": "warn", "max_share": 1.0}}})
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        result = run_cli("--params", str(work / "params.yaml"), "prepare", cwd=work,
                         check=False)
        assert result.returncode == 0, result.stderr
        cfg = load_config(work / "params.yaml")
        profile = (Path(cfg.paths.reports) / "data_profile.json").read_bytes()
        outputs.append((prepared_bytes(cfg), profile))
        warnings.append([x for x in result.stderr.splitlines()
                         if "more than one class" in x or "data contract" in x])
    assert outputs[0] == outputs[1]
    assert b'"pairs": 0' not in outputs[0][1]  # the search found leakage to compare
    assert warnings[0] == warnings[1] and len(warnings[0]) == 2, warnings


@pytest.mark.distributed
@pytest.mark.slow
def test_a_class_folder_a_worker_refuses_fails_in_the_local_engines_one_line(tmp_path):
    """The workers list the class folders now: an empty one (its only file hidden) stops
    prepare with the local listing's own line, not Beam's traceback, nothing swapped in."""
    from test_beam import IN_PROCESS

    from conftest import run_cli, tiny_params
    from images import photo_folder

    root = tmp_path / "photos"
    photo_folder(root, per_class=4, classes=2, seed=6)
    (root / "empty").mkdir()
    (root / "empty" / ".DS_Store").write_bytes(b"\0")
    params = tiny_params(tmp_path, tracking={"enabled": False}, data={
        "image_dir": str(root), "engine": "beam", "beam": {"options": IN_PROCESS}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_cli("--params", str(tmp_path / "params.yaml"), "prepare", cwd=tmp_path,
                     check=False)
    assert result.returncode == 2, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert line == (f"tfmlops prepare: error: class folder {root / 'empty'} is empty; add "
                    "images or remove the folder"), line
    assert not Path(params["paths"]["prepared"]).exists()
    assert not list(Path(params["paths"]["prepared"]).parent.glob(".prepared*"))


@pytest.mark.slow
def test_a_row_lost_between_the_listing_and_the_fold_fails_the_run(make_cfg, tmp_path,
                                                                   monkeypatch):
    """The driver no longer holds the file list, so the workers count what they listed
    and the driver compares the count with what came back folded, good or refused. The
    loss is planted in the shard grouping (one file's row dropped), on Beam's in-process
    runner in this process; the same run without the plant folds every file."""
    from images import photo_folder
    from tfmlops.errors import DataError
    from tfmlops.stages.prepare import beam
    from tfmlops.stages.prepare.images import list_classes

    root = tmp_path / "photos"
    photo_folder(root, per_class=4, classes=2, seed=7)
    (root / "c0" / "cut.jpg").write_bytes(b"\xff\xd8 not a photo")  # a refused one counts too
    cfg = make_cfg(data={"engine": "beam", "image_dir": str(root), "channels": 3,
                         "image_size": 16, "max_bad_fraction": 0.5,
                         "beam": {"options": ["--runner=DirectRunner",
                                              "--direct_running_mode=in_memory"]}})

    def prepared(name):
        out = tmp_path / name
        out.mkdir()
        classes, tally = beam.prepare_beam(cfg, root, list_classes(root), out)
        beam.remove_parts(tally)
        return tally

    tally = prepared("whole")
    assert (tally.good, len(tally.bad)) == (8, 1)

    by_shard = beam._by_shard
    dropped = []

    def losing_one(joined, shards):
        for item in by_shard(joined, shards):
            if dropped:
                yield item
            else:
                dropped.append(item)

    monkeypatch.setattr(beam, "_by_shard", losing_one)
    with pytest.raises(DataError, match=r"folded 8 files of the 9 it listed; nothing was "):
        prepared("lost")  # (the plant's closure runs on the runner's copy of `dropped`)
