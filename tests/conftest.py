"""Shared fixtures: real TensorFlow, real MLflow on temp SQLite, tiny real data.

`make_cfg` gives a Config whose every path lives under a temp folder, with
tiny params (16x16 digits, one small block, 2 epochs) and a temp SQLite
MLflow store. `prepared_digits` prepares the real digits once per session;
tests read it and never write into it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfmlops.artifacts import EDGE, MODEL_FILE
from tfmlops.files import hold_lock

# The user's environment must not steer the tests (nor the subprocesses they start): a
# cluster (TF_CONFIG), a distributed search (KERASTUNER_*), another Keras backend, hidden
# GPUs, another tracking or registry store (MLFLOW_*), a running DVC experiment or repo
# (DVC_*: `dvc exp run` exports DVC_EXP_NAME to the stages), tfmlops' own switches
# (TFMLOPS_*: injected faults, heartbeat periods), a global git config (signed commits).
# The suite's own knobs, which a person sets on purpose, stay.
LEAKY_PREFIXES = ("KERASTUNER_", "MLFLOW_", "DVC_", "TFMLOPS_")
LEAKY = ("TF_CONFIG", "KERAS_BACKEND", "CUDA_VISIBLE_DEVICES", "TF_USE_LEGACY_KERAS",
         "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
TEST_KNOBS = ("TFMLOPS_HYPOTHESIS_LONG", "TFMLOPS_MACHINE_EXAMPLES", "TFMLOPS_KILL_TEST",
              "TFMLOPS_TEST_POSTGRES_URI")
for _name in [n for n in os.environ if (n in LEAKY or n.startswith(LEAKY_PREFIXES))
              and n not in TEST_KNOBS]:
    os.environ.pop(_name)
os.environ.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
                   "GIT_AUTHOR_NAME": "tfmlops tests", "GIT_AUTHOR_EMAIL": "ci@example.invalid",
                   "GIT_COMMITTER_NAME": "tfmlops tests",
                   "GIT_COMMITTER_EMAIL": "ci@example.invalid"})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


@functools.cache
def committed_params_text() -> str:
    """The params.yaml of the checked-out commit, not the working file: a `dvc exp run`
    (the README's first command) or an edit must not change what the tests test."""
    try:
        return subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):  # not a git checkout (an sdist)
        return (ROOT / "params.yaml").read_text()


def committed_params() -> dict:
    return yaml.safe_load(committed_params_text())


def host_gpus() -> int:
    """The GPUs this host shows TensorFlow (what a test expects a run to use)."""
    from tfmlops.stages.train.strategy import visible_gpus

    return visible_gpus()

TINY = {
    "data": {"image_size": 16, "shards": 2},
    "model": {"blocks": [{"filters": 8, "kernel_size": 3, "separable": False},
                         {"filters": 16, "kernel_size": 3, "separable": False}],
              "convs_per_block": 1, "head_units": 32, "dropout": 0.1},
    "train": {"epochs": 2, "batch_size": 32, "early_stopping_patience": 0},
    "tune": {"max_trials": 2, "max_epochs": 1, "budget_minutes": 2.0},
    "prune": {"epochs": 1},
    # Three conversions of each model, not five: every variant costs a conversion, a LiteRT
    # pass over the test split and timing (test_prune_quantize builds all five).
    "quantize": {"representative_samples": 32, "latency_runs": 20, "latency_warmup": 2,
                 "variants": ["float32", "int8", "int8_sparse"]},
    "export": {"latency_runs": 20},
    "profiling": {"enabled": False},
}


# The tiny models (16 px, 2 to 8 epochs) are neither accurate nor calibrated on every class,
# and the tiny data sets' test splits hold a few dozen images: the gate's class, calibration
# and evaluated-images checks are loosened where a test wants a promotion.
LOOSE_GATE = {"min_accuracy": 0.5, "min_class_recall": 0.0, "max_class_drop": 0.5,
              "max_ece": 0.5, "min_edge_agreement": 0.5, "min_images": 1}


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_params(workdir: Path, **sections) -> dict:
    """The committed params.yaml, shrunk by TINY and `sections`, with paths under `workdir`."""
    params = committed_params()
    params = deep_merge(params, TINY)
    params["paths"] = {k: str(workdir / v) for k, v in params["paths"].items()}
    params["data"]["image_dir"] = params["paths"]["builtin"]
    params["tracking"]["uri"] = f"sqlite:///{workdir / 'mlflow.db'}"
    # Not the checkout's accepted reference (docs/data-contract.md: `tfmlops accept-reference`, then commit
    # it): the test data's classes are not the user's, and the contract would refuse them.
    params["data"]["contract"]["reference"] = str(no_reference(workdir / "reference_profile.json"))
    return deep_merge(params, sections)


NO_REFERENCE = '{"reference": null}\n'  # what a fresh clone commits: no accepted profile yet
# `dvc metrics show` and the README's `dvc exp show` have a column per DVC metric, the
# stages' headline keys (issue 51: every report's key was one, about 300 columns)
MAX_METRIC_COLUMNS = 60


def no_reference(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(NO_REFERENCE)
    return path


def project_dvc_config() -> str:
    """The project's .dvc/config without the user's remotes (docs/scaling.md's team block adds one
    and commits it): a scratch repo gets the project's settings, not the user's storage."""
    kept, section = [], ""
    for line in (ROOT / ".dvc" / "config").read_text().splitlines():
        if line.strip().startswith("["):
            section = line.strip()
        if section.startswith("['remote") or (section == "[core]" and
                                               line.strip().startswith("remote")):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


@pytest.fixture(autouse=True)
def _no_tracking_uri_in_env():
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI into this process, and the
    variable wins over params. Cleared before every test (a session fixture may have
    exported its store while being set up for this test) and after it (a stopped
    server must not leak into the next); a test that needs it sets it with monkeypatch."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture
def make_cfg(tmp_path):
    """make_cfg(**sections) -> Config under tmp_path; also writes tmp_path/params.yaml."""
    from tfmlops.config import load_config

    def make(workdir: Path | None = None, **sections):
        workdir = workdir or tmp_path
        params = tiny_params(workdir, **sections)
        path = workdir / "params.yaml"
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        return load_config(path)

    return make


# ------------------------------------ session fixtures: built once for all the workers

def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name`, built by `build(folder)` once for the whole session, whatever
    the number of xdist workers (pytest-xdist's own recipe: the workers' temp folders
    share a parent). The first worker to ask builds it under a lock; the others wait
    on the lock, then read it. A failed build is recorded, so the others fail at once
    with its error instead of building it again. The folder is read-only to its users."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    folder, done, failed = shared / name, shared / f"{name}.built", shared / f"{name}.failed"
    with hold_lock(shared / f"{name}.lock", f"tests: waiting for another worker to build {name}"):
        if failed.exists():
            pytest.fail(f"the session fixture {name} failed to build: {failed.read_text()}")
        if not done.exists():
            try:
                build(folder)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {str(e)[-2000:]}")
                raise
            done.touch()
    return folder


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory):
    """Real digits, prepared once at 16x16 (tracking off). Read-only for tests."""
    from tfmlops.config import load_config
    from tfmlops.stages import materialize, prepare

    def build(workdir: Path) -> None:
        workdir.mkdir()
        params = tiny_params(workdir, tracking={"enabled": False})
        (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        cfg = load_config(workdir / "params.yaml")
        materialize.run(cfg)
        prepare.run(cfg)

    return load_config(built_once(tmp_path_factory, "prepared_digits", build) / "params.yaml")


@pytest.fixture
def digits_workdir(tmp_path, prepared_digits, make_cfg):
    """A fresh workdir whose prepared data is a copy of the session's digits."""

    def make(**sections):
        shutil.copytree(prepared_digits.paths.prepared, tmp_path / "data" / "prepared")
        return make_cfg(**sections)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """This process's environment for a subprocess, minus what MLflow exported here: the
    tracking URI (mlflow.set_tracking_uri) and the experiment id (mlflow.set_experiment,
    which `mlflow run --experiment-name` refuses beside its option). A child picks its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"
    return env


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run `tfmlops ...` in a real subprocess (own TensorFlow, own Keras world)."""
    return _run_tool("tfmlops", args, cwd, env or {}, timeout, check)


def _run_tool(tool: str, args, cwd: Path, env: dict, timeout: float,
              check: bool) -> subprocess.CompletedProcess:
    """Run a venv command; with `check`, a non-zero exit fails with its output's tail."""
    proc = subprocess.run([str(VENV_BIN / tool), *args], cwd=cwd, env={**child_env(), **env},
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def mlflow_client(cfg):
    from tfmlops.tracking import tracking_uri, use_uri

    return use_uri(tracking_uri(cfg)).MlflowClient()


def stage_runs(cfg, stage: str):
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], f"tags.`tfmlops.stage` = '{stage}'")


def profile_runs(cfg, stage: str) -> list[Path]:
    """The stage's per-run profile folders on disk, oldest first (each name starts with
    its UTC time)."""
    from tfmlops.profiling import profile_dir

    parent = profile_dir(cfg, stage)
    return sorted(p for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def scratch_repo(dest: Path, params: dict | None = None) -> Path:
    """A git+DVC copy of this project (code, dvc.yaml, params) in `dest`, committed."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("dvc.yaml", "pyproject.toml", "requirements.lock", ".gitignore", ".dvcignore"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    # A dependency of prepare: "no reference yet", whatever the user accepted in the checkout.
    (dest / "data").mkdir(exist_ok=True)
    (dest / "data" / "reference_profile.json").write_text(NO_REFERENCE)
    (dest / "params.yaml").write_text(committed_params_text())
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / ".dvc").mkdir(exist_ok=True)
    (dest / ".dvc" / "config").write_text(project_dvc_config())
    (dest / ".dvc" / ".gitignore").write_text("/config.local\n/tmp\n/cache\n")
    if params is not None:
        (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git("init", "-q", "-b", "main", cwd=dest)
    git("config", "user.email", "ci@example.invalid", cwd=dest)
    git("config", "user.name", "tfmlops tests", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "scratch copy", cwd=dest)
    return dest


def dvc(*args: str, cwd: Path, timeout: float = 900, check: bool = True,
        env: dict | None = None) -> subprocess.CompletedProcess:
    return _run_tool("dvc", args, cwd, {"DVC_NO_ANALYTICS": "1", **(env or {})}, timeout, check)


@pytest.fixture(scope="session")
def pipeline_repo(tmp_path_factory):
    """(scratch repo, its first `dvc repro`): the whole pipeline on tiny params, run once
    per session and shared by the e2e tests. Read-only: a test that runs commands in it
    (the README's, an experiment) works in its own copy (`repo_copy`)."""
    return repro_once(tmp_path_factory, "pipeline", relative_tiny_params(
        tune={"max_trials": 2, "max_epochs": 1, "tuner": "random"},
        promote={"gate": {**LOOSE_GATE, "min_accuracy": 0.3, "max_latency_ms": 1000.0}},
    ))


def repro_once(tmp_path_factory, name: str, params, prepare=None):
    """(scratch repo, its first `dvc repro`), built once for the session (`built_once`) in
    `<folder>/repo`. `params(folder)` (or a dict) is its params.yaml; `prepare(folder, repo)`
    runs before the repro."""
    def build(root: Path) -> None:
        repo = scratch_repo(root / "repo", params(root) if callable(params) else params)
        if prepare is not None:
            prepare(root, repo)
        first = dvc("repro", cwd=repo, timeout=2400)
        (root / "first_repro.json").write_text(json.dumps(
            {"args": first.args, "stdout": first.stdout, "stderr": first.stderr}))

    root = built_once(tmp_path_factory, name, build)
    first = json.loads((root / "first_repro.json").read_text())
    return root / "repo", subprocess.CompletedProcess(first["args"], 0, first["stdout"],
                                                      first["stderr"])


@pytest.fixture(scope="session")
def rgb_photo_repo(tmp_path_factory):
    """(scratch repo, its photos, its first `dvc repro`): the suite's one RGB photo pipeline
    (tests/rgb_photos.py), shared by the photo, backbone and skew tests. Read-only."""
    import rgb_photos

    repo, first = repro_once(tmp_path_factory, "rgb_photos",
                             lambda root: rgb_photos.params(root / "photos"), rgb_photos.prepare)
    return repo, repo.parent / "photos", first


def repo_copy(repo: Path, dest: Path) -> Path:
    """A copy of a session's scratch repo for a test that changes it (the MLflow store's
    artifact folders stay the original's, which the copy only adds runs to)."""
    shutil.copytree(repo, dest, symlinks=True)
    return dest


def relative_tiny_params(**sections) -> dict:
    """TINY params with the repo's relative paths (for scratch repos run by dvc)."""
    params = committed_params()
    return deep_merge(deep_merge(params, TINY), sections)


# ------------------------------------------- export, promote and serving (issue 6)

def save_tiny_trained(cfg, epochs: int = 8) -> None:
    """Write what `train` and `quantize` leave for `export`, on the real prepared digits.

    The TINY model fitted for a few epochs, saved as `paths.train/model.keras`
    with `resolved_params.yaml`, and its float32 TFLite as quantize's edge
    variant (`paths.tflite/edge.json`).
    """
    import json

    import keras
    import tensorflow as tf

    from tfmlops.data import pipeline
    from tfmlops.model.builder import build_model
    from tfmlops.model.trained import write_resolved

    keras.utils.set_random_seed(cfg.seed)
    prepared = pipeline.load_prepared(cfg)
    model = build_model(cfg.model, keras, prepared.input_shape, prepared.num_classes)
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(pipeline.dataset(cfg, prepared, "train", batch_size=32, training=True),
              epochs=epochs, verbose=0)
    Path(cfg.paths.train).mkdir(parents=True, exist_ok=True)
    model.save(Path(cfg.paths.train) / MODEL_FILE)
    write_resolved(cfg, cfg.paths.train)
    tflite = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    Path(cfg.paths.tflite).mkdir(parents=True, exist_ok=True)
    (Path(cfg.paths.tflite) / "float32.tflite").write_bytes(tflite)
    edge = {"variant": "float32", "file": "float32.tflite", "accuracy": 0.0, "bytes": len(tflite),
            "agreement": 1.0}  # the float32 file of the model itself
    (Path(cfg.paths.tflite) / EDGE).write_text(json.dumps(edge))


@pytest.fixture(scope="session")
def exported_digits(tmp_path_factory, prepared_digits):
    """A real `export` (tracking on, temp SQLite) of a tiny trained model. Read-only:
    tests that promote use their own registered-model names in its store."""
    from tfmlops.config import load_config
    from tfmlops.stages import export

    def build(workdir: Path) -> None:
        workdir.mkdir()
        params = tiny_params(workdir, promote={"gate": LOOSE_GATE},
                             profiling={"enabled": True, "start_step": 1, "steps": 1})
        (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        cfg = load_config(workdir / "params.yaml")
        shutil.copytree(prepared_digits.paths.prepared, cfg.paths.prepared)
        save_tiny_trained(cfg)
        export.run(cfg)

    return load_config(built_once(tmp_path_factory, "exported_digits", build) / "params.yaml")


@pytest.fixture(scope="session")
def exported_offline(exported_digits):
    """The exported Keras model's answers on the test split, in export's order."""
    from tfmlops.data.pipeline import load_prepared
    from tfmlops.data.stored_split import StoredSplit
    from tfmlops.model.trained import load_keras3, trained_model_path

    prepared = load_prepared(exported_digits)
    model = load_keras3(trained_model_path(exported_digits))
    split = StoredSplit.of(prepared)
    encoded, x, y = split.arrays()
    return {"prepared": prepared, "split": split, "encoded": encoded, "x": x, "y": y,
            "probs": model.predict(x, verbose=0)}


# --------------------------------------------- CI's shape: the longest modules first

MODULE_COSTS = Path(__file__).with_name("module_costs.json")


def pytest_collection_modifyitems(config, items):
    """Modules in order of their measured seconds, longest first (module_costs.json, from a
    full run's junit report: `python tests/module_costs.py junit.xml`). With `--dist
    loadscope --no-loadscope-reorder` the workers take whole modules in this order, so the
    few long e2e modules start at once instead of last, when one worker would run them
    alone. A module not in the table (new) counts as 60 s. Stable: a module's tests keep
    their order."""
    if not MODULE_COSTS.exists():
        return
    costs = json.loads(MODULE_COSTS.read_text())
    items.sort(key=lambda item: -costs.get(item.nodeid.split("::")[0], 60.0))
