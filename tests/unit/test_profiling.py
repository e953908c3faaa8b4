"""Profile folders: one per run under the stage, the newest `profiling.keep_runs` kept."""

from conftest import profile_runs
from tfmlops import profiling


def test_each_run_gets_its_own_folder_and_only_the_last_n_stay(make_cfg, monkeypatch):
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    cfg = make_cfg(profiling={"keep_runs": 3})
    made = []
    for i in range(4):  # N + 1 runs, several within the same second
        folder = profiling.fresh_profile_dir(cfg, "train")
        (folder / "events.out").write_text(str(i))
        made.append(folder)
    assert len(set(made)) == 4
    assert all(f.parent == profiling.profile_dir(cfg, "train") for f in made)
    kept = profile_runs(cfg, "train")
    assert kept == made[1:]  # the oldest went; the others keep their files
    assert [(f / "events.out").read_text() for f in kept] == ["1", "2", "3"]


def test_run_folder_carries_the_dvc_experiment_name(make_cfg, monkeypatch):
    monkeypatch.setenv("DVC_EXP_NAME", "lean-fish")
    cfg = make_cfg()
    folder = profiling.fresh_profile_dir(cfg, "export")
    assert folder.name.endswith("-lean-fish") and folder.parent.name == "export"
    assert profile_runs(cfg, "export") == [folder]
