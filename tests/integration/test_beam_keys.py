"""An object key that names a path outside the stage (review H2), end to end: prepare
on Apache Beam reading an s3:// folder from moto's S3 server on 127.0.0.1, the bucket
holding `photos//<an absolute path>/planted.sh` beside good photos. prepare exits 2 in
one line naming the object, and writes nothing anywhere (test_untrusted_names.py
searches the listing and path functions themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import free_port, run_cli, tiny_params
from images import photo_folder

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # Beam runners, a moto S3 server


def test_a_key_naming_an_absolute_path_fails_in_one_line_and_writes_nothing(tmp_path):
    import boto3
    from moto.server import ThreadedMotoServer

    photos = tmp_path / "photos"
    photo_folder(photos, per_class=3, classes=2, seed=4)
    planted = tmp_path / "elsewhere" / "planted.sh"  # where the key points: must not exist
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # credentials from the environment, as docs/scaling.md has them (not in data.beam.options)
    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    try:
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                          region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
        s3.create_bucket(Bucket="team")
        for path in sorted(p for p in photos.rglob("*") if p.is_file()):
            s3.upload_file(str(path), "team", f"photos/{path.relative_to(photos)}")
        key = f"photos/{planted}"  # photos//tmp/.../planted.sh
        s3.put_object(Bucket="team", Key=key, Body=b"#!/bin/sh\necho owned\n")
        work = tmp_path / "work"
        work.mkdir()
        params = tiny_params(work, tracking={"enabled": False}, data={
            "image_dir": "s3://team/photos", "engine": "beam", "channels": 3,
            "image_size": 16, "max_bad_fraction": 0.5, "beam": {"options": [
                "--runner=DirectRunner", "--direct_running_mode=in_memory",
                f"--s3_endpoint_url=http://127.0.0.1:{port}", "--s3_region_name=us-east-1"]}})
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        result = run_cli("--params", str(work / "params.yaml"), "prepare", cwd=work, env=creds,
                         check=False)
    finally:
        server.stop()
    assert result.returncode == 2, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert line.startswith(f"tfmlops prepare: error: 's3://team/{key}' has a name prepare cannot use "
                           "(an empty path component ('//')); rename or remove it"), line
    assert not planted.parent.exists()
    assert not Path(params["paths"]["prepared"]).exists()
    assert not list(Path(params["paths"]["prepared"]).parent.glob(".prepared*"))  # no staging
