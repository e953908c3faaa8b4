"""Where prepare's Beam workers stage their output (issue 52): `data.beam.staging` is
checked when params are read (required for a remote runner, a place both sides reach,
no credential in it), and a run removes only the stale prefixes it made: its marker,
begun before it, nobody holding them; never anything else under the staging URL."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_config_credentials import SECRET, refusal

from tfmlops.config import config_from_dict
from tfmlops.files import machine_id
from tfmlops.stages.prepare import beam_staging as staging

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=localhost:8099",
            "--environment_type=EXTERNAL", "--environment_config=localhost:50000"]


def beam(options, staging_url=None, image_dir="/mnt/photos") -> dict:
    section = {"options": options} | ({"staging": staging_url} if staging_url is not None else {})
    return {"data": {"engine": "beam", "image_dir": image_dir, "beam": section}}


def staging_refusal(options, staging_url=None, image_dir="/mnt/photos") -> str:
    """The one line prepare fails with, once Beam took the runner (beam.pipeline_options)."""
    from tfmlops.errors import ConfigError

    cfg = config_from_dict(beam(options, staging_url, image_dir))
    with pytest.raises(ConfigError) as err:
        staging.check_staging(cfg, beam_runner(options))
    assert len(str(err.value).splitlines()) == 1
    return str(err.value)


def beam_runner(options) -> str:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    return PipelineOptions(options).view_as(StandardOptions).runner or "DirectRunner"


@pytest.mark.parametrize("options", [
    PORTABLE, ["--runner=DataflowRunner", "--project=p"], ["--runner", "FlinkRunner"],
    ["--runner=SparkRunner"], ["--runner=apache_beam.runners.portability.portable_runner."
                               "PortableRunner"]])
def test_a_remote_runner_without_staging_is_refused_naming_the_key(options):
    message = staging_refusal(options)
    assert message.startswith("data.beam.staging is required") and "s3://" in message, message


@pytest.mark.parametrize("url", ["s3://bucket/runs", "gs://bucket/tmp/tfmlops", "/mnt/shared/runs"])
def test_a_remote_runner_with_a_reachable_staging_passes(url):
    cfg = config_from_dict(beam(PORTABLE, url))
    staging.check_staging(cfg, "PortableRunner")
    assert cfg.data.beam.staging == url


def test_the_in_process_runner_needs_no_staging():
    for options in (["--runner=DirectRunner"], ["--direct_num_workers=2"], ["--runner=direct"]):
        staging.check_staging(config_from_dict(beam(options, image_dir="data/x")),
                              beam_runner(options))


@pytest.mark.parametrize("url", ["runs/here", "http://host/runs", "s3://", "s3:///key",
                                 "file:///tmp/x", "hdfs://nn/x"])
def test_staging_that_is_not_an_s3_or_gs_url_or_an_absolute_path_is_refused(url):
    message = refusal(beam(["--runner=DirectRunner"], url))
    assert message.startswith("data.beam.staging") and "absolute path" in message, message


@pytest.mark.parametrize("url", [f"s3://user:{SECRET}@bucket/runs",
                                 f"gs://bucket/runs?token={SECRET}"])
def test_staging_with_a_credential_is_refused_without_showing_it(url):
    message = refusal(beam(PORTABLE, url))
    assert "data.beam.staging" in message and "password or token" in message, message


def test_a_remote_runner_reading_a_relative_image_folder_is_refused():
    message = staging_refusal(PORTABLE, "s3://b/runs", image_dir="data/photos")
    assert "data.image_dir data/photos is relative" in message, message


# -- stale prefixes: made by a run that is gone, under the staging root

DEAD_PID = 4_194_305  # above Linux's largest pid: no process has it


def plant(root: Path, name: str, files=("rows.rows", "q/a[1].jpg"), owner: dict | None = None,
          marker: str | None = None) -> Path:
    """A folder `name` under `root` holding `files`, with an owner marker (ours unless
    `owner` changes it) unless `marker` is "" (none) or raw text."""
    base = root / name
    for rel in files:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(f"{name}/{rel}".encode())
    if marker is None:
        host, machine = machine_id()
        marker = json.dumps({"kind": staging.KIND, "run": name, "host": host,
                             "machine": machine, "pid": DEAD_PID} | (owner or {}))
    if marker:
        base.mkdir(parents=True, exist_ok=True)
        (base / staging.MARKER).write_text(marker)
    return base


def prefix_name(age_s: float, run_id: str = "0123456789ab") -> str:
    import time

    return f"tfmlops-prepare-{staging.stamp(time.time() - age_s)}-{run_id}"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture
def own(tmp_path):
    run = staging.RunPrefix(str(tmp_path / "runs")).start()
    yield run
    run.remove()


def test_an_older_prefix_of_a_dead_run_on_this_machine_is_removed_with_its_files(tmp_path, own):
    dead = plant(tmp_path / "runs", prefix_name(60))
    assert staging.remove_stale(own.root, own) == [str(dead)]
    assert not dead.exists() and Path(own.base, staging.MARKER).exists()


@pytest.mark.parametrize("case", ["live pid", "newer", "no marker", "another kind",
                                  "a copied marker", "not JSON", "another machine, fresh",
                                  "not our name", "a link"])
def test_what_is_not_a_stale_prefix_of_ours_stays(tmp_path, own, case):
    root = tmp_path / "runs"
    name = prefix_name(60)
    if case == "live pid":
        plant(root, name, owner={"pid": os.getpid()})
    elif case == "newer":
        plant(root, prefix_name(-60))
    elif case == "no marker":
        plant(root, name, marker="")
    elif case == "another kind":
        plant(root, name, owner={"kind": "someone's else"})
    elif case == "a copied marker":
        plant(root, name, owner={"run": prefix_name(120, "ba9876543210")})
    elif case == "not JSON":
        plant(root, name, marker="tfmlops prepare beam staging\n")
    elif case == "another machine, fresh":
        plant(root, name, owner={"machine": "00000000", "host": "elsewhere"})
    elif case == "not our name":
        plant(root, "tfmlops-prepare-old", owner={"run": "tfmlops-prepare-old"})
    elif case == "a link":
        target = plant(tmp_path / "elsewhere", name)
        (root / name).symlink_to(target)
    before = tree(tmp_path)
    assert staging.remove_stale(own.root, own) == []
    assert tree(tmp_path) == before


def test_another_machines_prefix_is_stale_once_its_marker_was_not_rewritten_for_the_lease(
        tmp_path, own):
    base = plant(tmp_path / "runs", prefix_name(3600), owner={"machine": "00000000"})
    beaten = os.stat(own.marker).st_mtime - staging.LEASE - 1
    os.utime(base / staging.MARKER, (beaten, beaten))
    assert staging.remove_stale(own.root, own) == [str(base)]


def test_a_run_removes_its_own_prefix_and_nothing_beside_it(tmp_path):
    root = tmp_path / "runs"
    plant(root, "theirs", marker="")
    run = staging.RunPrefix(str(root)).start()
    with staging.create(staging.join(run.base, "quarantine", "c1", "a[1] *?.jpg")) as fh:
        fh.write(b"x")
    assert run.files("quarantine/**") == [os.path.join(run.base, "quarantine/c1/a[1] *?.jpg")]
    run.remove()
    assert sorted(p.name for p in root.iterdir()) == ["theirs"]


def test_nothing_is_written_under_a_prefix_once_its_run_removed_it(tmp_path):
    """A cancelled job may go on running (Beam's local job service does not stop it): its
    workers' writes under the removed prefix are refused, so nothing is left there that no
    run would remove."""
    from tfmlops.errors import DataError

    run = staging.RunPrefix(str(tmp_path / "runs")).start()
    inside = staging.join(run.base, "quarantine", "c0", "empty.jpg")
    with staging.create(inside) as fh:  # the run is live
        fh.write(b"x")
    run.remove()
    with pytest.raises(DataError, match=r"staging prefix .* is gone .*: not writing "
                                        r"quarantine/c0/empty.jpg"):
        staging.create(inside)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*"))


KINDS = ["stale", "live", "newer", "unmarked", "another kind", "copied", "odd name", "loose file",
         "nested"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 10**6),
                          st.lists(st.sampled_from(["a.rows", "x/b.part", "q/[1].jpg", "*.part",
                                                    staging.MARKER + ".bak", "deep/er/c"]),
                                   min_size=1, max_size=3, unique=True)),
                max_size=8))
def test_cleanup_never_deletes_anything_it_did_not_create(entries):
    """Over random mixes of stale, live, newer, unmarked and foreign prefixes and files,
    `remove_stale` removes exactly the stale prefixes of ours; every other byte stays.
    (Plant: a cleanup that trusts the name alone deletes the unmarked ones.)"""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        root.mkdir()
        own = staging.RunPrefix(str(root)).start()
        try:
            expected_gone = set()
            for i, (kind, age, files) in enumerate(entries):
                name = prefix_name(age, f"{i:012x}")
                if kind == "stale":
                    expected_gone.add(str(plant(root, name, files)))
                elif kind == "live":
                    plant(root, name, files, owner={"pid": os.getpid()})
                elif kind == "newer":
                    plant(root, prefix_name(-age, f"{i:012x}"), files)
                elif kind == "unmarked":
                    plant(root, name, files, marker="")
                elif kind == "another kind":
                    plant(root, name, files, owner={"kind": "not tfmlops"})
                elif kind == "copied":
                    plant(root, name, files, owner={"run": prefix_name(age + 1, "f" * 12)})
                elif kind == "odd name":
                    plant(root, f"{name}-x", files, owner={"run": f"{name}-x"})
                elif kind == "loose file":
                    (root / f"{name}.{files[0].replace('/', '_')}").write_bytes(b"theirs")
                else:  # a marked prefix one level down: not under the staging root itself
                    plant(root / "team", name, files)
            before = tree(root)
            removed = staging.remove_stale(str(root), own)
            assert set(removed) == expected_gone
            kept = {k: v for k, v in before.items()
                    if not any(str(root / k).startswith(g + os.sep) for g in expected_gone)}
            assert tree(root) == kept
        finally:
            own.remove()
            shutil.rmtree(root, ignore_errors=True)
