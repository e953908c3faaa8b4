"""The whole `dvc repro` in a scratch git repo, tiny params, real everything."""

import json
import shutil
import subprocess

import pytest
import yaml

from conftest import MAX_METRIC_COLUMNS, dvc, repo_copy
from tfmlops.artifacts import HEADLINES, TAG_STAGE
from tfmlops.stage_spec import specs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

STAGES = ["materialize", "prepare", "tune", "train", "prune", "quantize", "export", "promote"]


@pytest.fixture(scope="module")
def repro(pipeline_repo, tmp_path_factory):
    """The session's pipeline, in a copy of this module's own: it runs `dvc repro` again."""
    repo, first = pipeline_repo
    return repo_copy(repo, tmp_path_factory.mktemp("full") / "repo"), first


def test_every_stage_ran_and_is_locked(repro):
    repo, first = repro
    for stage in STAGES:
        assert f"Running stage '{stage}'" in first.stdout, stage
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert set(STAGES) <= set(lock)


# What other libraries print that a person running the pipeline cannot act on: Python
# warnings (MLflow's "Add type hints", TFLite's "Statistics for quantized inputs"), the
# C++ logs of TensorFlow, the TFLite converter and LiteRT, MLflow's INFO lines and its
# artifact progress bars.
NOISE = ("Warning:", "warnings.warn(", "color_warning(", "Downloading artifacts", "it/s]",
         " INFO mlflow", "INFO: Created TensorFlow Lite", "fully_quantize:", "I0000 ", "W0000 ",
         "E0000 ", "absl::InitializeLog", "oneDNN", "cuInit")


def test_the_terminal_holds_no_third_party_noise_and_each_stage_log_does(repro):
    repo, first = repro
    terminal = first.stdout + first.stderr
    assert [n for n in NOISE if n in terminal] == [], terminal[-6000:]
    logs = repo / ".tfmlops" / "logs"
    assert {p.stem for p in logs.glob("*.log")} == set(STAGES)
    # routed there, not lost: the TFLite converter's notices are quantize's
    assert "fully_quantize:" in (logs / "quantize.log").read_text()
    # a cause fixed, not hidden: the served model's predict has type hints
    assert "Add type hints" not in "".join(p.read_text() for p in logs.glob("*.log"))


def test_second_repro_is_a_no_op(repro):
    import re

    repo, _ = repro
    again = dvc("repro", cwd=repo)
    # promote runs on every repro (always_changed, so an applied experiment is promoted)
    # and does nothing when production already holds the exported version
    assert re.findall(r"Running stage '([\w-]+)'", again.stdout) == ["promote"], again.stdout
    assert "already holds @production; nothing to do" in again.stdout + again.stderr
    assert "didn't change, skipping" in again.stdout


def test_metrics_and_plots_show(repro):
    repo, _ = repro
    metrics = json.loads(dvc("metrics", "show", "--json", cwd=repo).stdout)
    files = next(iter(metrics.values()))["data"]
    names = {f.split("/")[-1] for f in files}
    assert {"prepare.json", "train.json", "quantize.json", "export.json"} <= names
    train = next(v["data"] for k, v in files.items() if k.endswith("train.json"))
    assert train["test_accuracy"] > 0.3
    plots = dvc("plots", "show", "--json", cwd=repo)
    assert "train_history.csv" in plots.stdout


# headline keys this pipeline's reports lack, and why
ABSENT = {"promote": {"evaluation.production.accuracy",  # the first promotion: no production
                      "evaluation.paired.difference"}}   # to compare with


def leaves(data: dict, prefix: str = "") -> dict:
    """{"a.b": value} of every value in nested dicts, as DVC makes its columns."""
    out = {}
    for key, value in data.items():
        out.update(leaves(value, f"{prefix}{key}.") if isinstance(value, dict)
                   else {f"{prefix}{key}": value})
    return out


def test_dvc_metrics_are_the_stages_headlines_few_enough_to_read(pipeline_repo, tmp_path):
    """The metrics DVC shows are the headline files alone, each the declared keys of its
    stage's report (a misspelt key never shows: only ABSENT may be missing). On the first
    repro's reports (a copy: this module's own repo reruns promote, whose answer then
    has no evaluation)."""
    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    shown = json.loads(dvc("metrics", "show", "--json", cwd=repo).stdout)
    files = {path: v["data"] for path, v in next(iter(shown.values()))["data"].items()}
    columns = [f"{path}:{key}" for path, data in files.items() for key in leaves(data)]
    assert len(columns) <= MAX_METRIC_COLUMNS, (len(columns), columns)
    headlined = [s for s in specs() if s.headline]
    assert set(files) == {f"reports/{HEADLINES}/{s.name}.json" for s in headlined}
    for s in headlined:
        report = json.loads((repo / "reports" / f"{s.name}.json").read_text())
        assert files[f"reports/{HEADLINES}/{s.name}.json"] == s.headline_of(report), s.name
        assert set(s.headline) - set(s.headline_of(report)) == ABSENT.get(s.name, set()), s.name


def test_mlflow_holds_one_run_per_stage_with_lineage_to_prepare(repro):
    import mlflow

    repo, _ = repro
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tfmlops")
    runs = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'")
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    by_stage = {}
    for r in top:
        by_stage.setdefault(r.data.tags[TAG_STAGE], []).append(r)
    tracked = [s for s in STAGES if s != "materialize"]
    assert {s: len(by_stage.get(s, [])) for s in tracked} == {s: 1 for s in tracked}
    ids = {s: by_stage[s][0].info.run_id for s in tracked}

    def ancestors(stage):
        seen, todo = set(), [ids[stage]]
        while todo:
            run = client.get_run(todo.pop())
            for key, value in run.data.tags.items():
                if key.startswith("tfmlops.upstream.") and value not in seen:
                    seen.add(value)
                    todo.append(value)
        return seen

    assert ids["prepare"] in ancestors("promote")
    assert ids["train"] in ancestors("export")
    assert ids["tune"] in ancestors("train")


def test_a_registered_version_holds_production(repro):
    import mlflow

    repo, _ = repro
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    version = client.get_model_version_by_alias("digits-classifier", "production")
    export = json.loads((repo / "reports" / "export.json").read_text())
    # the version this pipeline's export registered, the first of a fresh store
    assert int(version.version) == export["registered_version"] == 1
    decision = json.loads((repo / "reports" / "promote.json").read_text())
    # the first repro promoted it; a later one (test_second_repro) found it in place
    assert (decision["outcome"], decision["promoted"]) in (("promoted", True), ("unchanged", False))
    assert str(decision["candidate"]) == str(decision["production_after"]) == str(version.version)


def test_mlflow_run_main_runs_the_pipeline_through_dvc(pipeline_repo, tmp_path):
    """MLproject's `main` (`mlflow run . -e main --env-manager local`) is `dvc repro`: on
    the reproduced pipeline only promote runs (always_changed), under the launcher run."""
    import re

    import mlflow

    from conftest import ROOT, VENV_BIN, child_env, git

    repo = repo_copy(pipeline_repo[0], tmp_path / "repo")
    shutil.copy2(ROOT / "MLproject", repo / "MLproject")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "MLproject", cwd=repo)
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    proc = subprocess.run([str(VENV_BIN / "mlflow"), "run", ".", "-e", "main",
                           "--env-manager", "local", "--experiment-name", "tfmlops"],
                          cwd=repo, env={**child_env(), "MLFLOW_TRACKING_URI": uri},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.findall(r"Running stage '([\w-]+)'", proc.stdout) == ["promote"], proc.stdout
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tfmlops").experiment_id],
                              "tags.`mlflow.project.entryPoint` = 'main'")
    assert [r.info.status for r in runs] == ["FINISHED"]
