"""Export's registration order (issue 14, item 14): outputs in place, then the version,
then `registered.json` beside them; a failure after registration never leaves a
version that no `registered.json` names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import mlflow_client, save_tiny_trained
from tfmlops.artifacts import FORMATS_CSV, REGISTERED, SERVING

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_a_crash_around_registration_leaves_one_version_named_by_registered_json(
        prepared_digits, make_cfg, monkeypatch):
    """First the crash lands between registering the version and writing registered.json;
    the rerun (a new run id, converted files that may differ) finds the version registered
    for the same inputs (the trained model, the edge variant, export's params) instead of
    registering a second one, then fails after registration: registered.json names it."""
    from tfmlops.stages import export

    cfg = make_cfg(promote={"registered_model": "export-order"})
    shutil.copytree(prepared_digits.paths.prepared, cfg.paths.prepared)
    save_tiny_trained(cfg, epochs=2)
    real_write = export.write_json

    class Crash(BaseException):
        pass

    def crash_at_registered_json(path, data):
        if Path(path).name == REGISTERED:
            raise Crash("killed before registered.json")
        return real_write(path, data)

    monkeypatch.setattr(export, "write_json", crash_at_registered_json)
    with pytest.raises(Crash):
        export.run(cfg)
    monkeypatch.setattr(export, "write_json", real_write)
    # A report export writes after registering cannot be written: the rerun fails there.
    (Path(cfg.paths.reports) / FORMATS_CSV).mkdir(parents=True)
    with pytest.raises(OSError):
        export.run(cfg)

    versions = mlflow_client(cfg).search_model_versions("name = 'export-order'")
    assert [str(v.version) for v in versions] == ["1"]
    registered = Path(cfg.paths.export) / REGISTERED
    assert registered.is_file(), "a version was registered but paths.export does not name it"
    named = json.loads(registered.read_text())
    assert named["version"] == "1" and named["model_uri"] == versions[0].source
    assert (Path(cfg.paths.export) / SERVING).is_file()
