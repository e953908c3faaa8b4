"""What keeps tracking cheap must not lose anything: every metric, param and tag is in the
run once it ends, the model logged in a thread from its saved file is in the run, and a failure in that
thread fails the stage instead of vanishing with it. Real MLflow on a temp SQLite store."""

import numpy as np
import pytest

from conftest import mlflow_client, stage_runs
from tfmlops import tracking
from tfmlops.artifacts import MODEL_FILE
from tfmlops.tracking import keras_file
from tfmlops.tracking.run import Background

pytestmark = pytest.mark.timeout(300)


def tiny_keras_model():
    import keras

    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))


def saved_model(folder, example):
    """A tiny model saved into `folder`, described as the stage's process describes it for
    the sidecar's run (keras_file.describe), and its file."""
    model = tiny_keras_model()
    model.save(folder / MODEL_FILE)
    return model, keras_file.describe(model, example, folder / MODEL_FILE), folder / MODEL_FILE


def test_metrics_params_and_tags_are_all_in_the_run_when_it_ends(tmp_path, make_cfg):
    cfg = make_cfg()
    params = {f"p{i:03d}": i for i in range(150)}  # more than one batch of 100
    with tracking.stage_run(cfg, "train", tmp_path / "out", params=params) as run:
        for step in range(1, 41):
            run.log_metrics({"loss": 1.0 / step, "val_loss": 2.0 / step}, step=step)
        run.set_tags({"tfmlops.precision": "float32"})
    (finished,) = stage_runs(cfg, "train")
    assert finished.info.status == "FINISHED"
    history = mlflow_client(cfg).get_metric_history(finished.info.run_id, "val_loss")
    assert sorted(m.step for m in history) == list(range(1, 41))
    assert {m.step: m.value for m in history}[8] == pytest.approx(0.25)
    assert finished.data.params == {k: str(v) for k, v in params.items()}
    assert finished.data.tags["tfmlops.precision"] == "float32"


def test_a_model_logged_in_a_thread_is_in_the_run_with_its_signature(tmp_path, make_cfg):
    cfg = make_cfg()
    example = np.random.default_rng(0).random((2, 4), dtype=np.float32)
    model, described, saved = saved_model(tmp_path, example)
    with tracking.stage_run(cfg, "train", tmp_path / "out", params={"a": 1}) as run:
        job = run.start_saved_keras_model(described)
        run.log_metrics({"during": 1.0})  # the stage goes on while the model is logged
        assert job.wait(saved) is True
    (finished,) = stage_runs(cfg, "train")
    client = mlflow_client(cfg)
    (logged,) = client.search_logged_models([finished.info.experiment_id])
    assert logged.source_run_id == finished.info.run_id
    import mlflow

    info = mlflow.models.get_model_info(f"models:/{logged.model_id}")
    assert info.signature is not None
    assert tuple(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == (-1, 4)
    assert info.saved_input_example_info is not None  # the example is kept, only not reloaded
    reloaded = mlflow.tensorflow.load_model(f"models:/{logged.model_id}")
    np.testing.assert_allclose(reloaded(example).numpy(), model(example).numpy(), rtol=1e-6)
    assert not (tmp_path / "reports" / "outbox").exists() or not any(
        (tmp_path / "reports" / "outbox").iterdir())


def test_a_failure_in_the_model_thread_fails_the_stage(tmp_path, make_cfg):
    cfg = make_cfg()
    _, described, saved = saved_model(tmp_path, np.zeros((1, 4), np.float32))
    described["keras_module"] = None  # a description the flavour cannot write: a bug
    with pytest.raises(TypeError):
        with tracking.stage_run(cfg, "train", tmp_path / "out", params={"a": 1}) as run:
            run.start_saved_keras_model(described).wait(saved)
    (failed,) = stage_runs(cfg, "train")
    assert failed.info.status == "FAILED"
    # Not mistaken for the store being away: nothing queued for `tfmlops sync`.
    outbox = tmp_path / "reports" / "outbox"
    assert not outbox.exists() or not any(outbox.glob("*.jsonl"))


def test_the_run_waits_for_a_model_the_stage_did_not_wait_for(tmp_path, make_cfg):
    cfg = make_cfg()
    _, described, _ = saved_model(tmp_path, np.zeros((1, 4), np.float32))
    with tracking.stage_run(cfg, "train", tmp_path / "out", params={"a": 1}) as run:
        run.start_saved_keras_model(described)
    (finished,) = stage_runs(cfg, "train")
    assert finished.info.status == "FINISHED"
    assert len(mlflow_client(cfg).search_logged_models([finished.info.experiment_id])) == 1


def test_a_run_in_the_stage_process_refuses_a_keras_model_object(tmp_path, make_cfg):
    """A Keras model is logged by the sidecar's run, from its file; a run in the stage's
    process says so rather than dropping the model. Tracking off: nothing to log."""
    with tracking.stage_run(make_cfg(), "train", tmp_path / "out", params={"a": 1}) as run:
        with pytest.raises(TypeError, match="sidecar"):
            run.start_keras_model(tiny_keras_model(), input_example=np.zeros((1, 4)))
    off = make_cfg(tracking={"enabled": False})
    with tracking.stage_run(off, "train", tmp_path / "off", params={"a": 1}) as run:
        assert run.start_keras_model(tiny_keras_model()).wait(None) is False


def test_background_raises_its_error_in_the_joining_thread():
    def boom():
        raise ValueError("from the thread")

    job = Background(boom, "test")
    with pytest.raises(ValueError, match="from the thread"):
        job.join()
    assert Background(lambda: 7, "test").join() == 7
