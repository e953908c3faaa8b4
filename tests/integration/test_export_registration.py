"""Export's registration order (issue 14, item 14): outputs in place, then the version,
then `registered.json` beside them; a failure after registration never leaves a
version that no `registered.json` names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import mlflow_client, save_tiny_trained

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_a_failure_after_registration_leaves_registered_json_naming_the_version(
        prepared_digits, make_cfg):
    from tfmlops.stages import export

    cfg = make_cfg(promote={"registered_model": "export-order"})
    shutil.copytree(prepared_digits.paths.prepared, cfg.paths.prepared)
    save_tiny_trained(cfg, epochs=2)
    # A report export writes after registering cannot be written: the stage fails there.
    (Path(cfg.paths.reports) / export.FORMATS_CSV).mkdir(parents=True)

    with pytest.raises(OSError):
        export.run(cfg)

    versions = mlflow_client(cfg).search_model_versions("name = 'export-order'")
    assert len(versions) == 1
    registered = Path(cfg.paths.export) / "registered.json"
    assert registered.is_file(), "a version was registered but paths.export does not name it"
    assert json.loads(registered.read_text())["version"] == str(versions[0].version)
    assert (Path(cfg.paths.export) / "serving.json").is_file()
