"""tune's final round forgets an earlier search's finalists, and nothing else in its folder."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.stages.tune import final_fit

NAMES = st.sampled_from(["params", "trial-01", "trial-07", "trial-12"])


@settings(max_examples=30, deadline=None)
@given(made=st.sets(NAMES), current=st.sets(NAMES), foreign=st.sets(NAMES | st.just("notes")))
def test_forget_others_removes_only_its_own_stale_finalists(tmp_path_factory, made, current,
                                                             foreign):
    tuner = tmp_path_factory.mktemp("tuner")
    cfg = SimpleNamespace(paths=SimpleNamespace(tuner=str(tuner)))
    root = tuner / final_fit.FINAL_DIR
    for name in made:  # the project's own: made by finalist_dir
        final_fit.finalist_dir(cfg, name)
    for name in foreign - made:  # a user's folder of the same name, unmarked
        (root / name).mkdir(parents=True)
        (root / name / "keep.txt").write_text("mine")
    final_fit.forget_others(cfg, sorted(current))
    left = {p.name for p in root.iterdir()} if root.exists() else set()
    assert left == (made & current) | (foreign - made)
