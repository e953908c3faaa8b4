"""A Keras model logged to MLflow from the file the stage already saved, without
TensorFlow in the logging process.

`mlflow.tensorflow.save_model` imports TensorFlow and saves the model again; the
tracking sidecar has only the `.keras` file and what `describe(model, example)` took
from the model in the stage's process. `log_saved` writes the layout the flavour writes
(MLflow 3.x, `mlflow/tensorflow/__init__.py` save_model, Keras branch), so MLflow loads
and serves it as the flavour's own (tests/unit/test_tracking_sidecar.py compares them).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from tfmlops.tracking.uri import client, import_mlflow

DATA = "data"  # the flavour's _KERAS_MODEL_DATA_PATH
SAVE_FORMAT = "tf"  # what the flavour writes when save_format is not given


def describe(model, example, saved: str | Path) -> dict[str, Any]:
    """In the stage's process (TensorFlow loaded, MLflow not): what the logging
    process needs to log `model` from its `saved` file."""
    import importlib

    import tensorflow as tf

    keras_module = importlib.import_module("tensorflow.keras")
    described = {"saved": str(saved), "example": example,
                 "output": model(example, training=False).numpy(),
                 "keras_module": keras_module.__name__, "tf_version": tf.__version__,
                 "custom_objects": None}
    try:  # as the flavour does (get_global_custom_objects): registered objects go along
        from tensorflow.keras.saving import get_custom_objects

        custom = get_custom_objects()
    except Exception:  # noqa: BLE001 - no registry in this Keras: nothing to add
        custom = None
    if custom:
        import cloudpickle

        described["custom_objects"] = cloudpickle.dumps(custom)
    return described


def log_saved(run_id: str, described: dict[str, Any], pip_requirements: list[str]) -> None:
    """Log the described model into `run_id` as `mlflow.tensorflow.log_model` does, from
    any thread (no fluent run): its logged model is created in the run's experiment by
    id (log_model would put it in the default experiment), with the run's params."""
    from mlflow.models import Model, infer_signature

    run = client().get_run(run_id)
    model_id = import_mlflow().initialize_logged_model(
        name="model", source_run_id=run_id, params=dict(run.data.params),
        experiment_id=run.info.experiment_id).model_id
    # validate_serving_input would reload the model (TensorFlow's import): the
    # signature already says what the input is.
    Model.log(artifact_path=None, name="model", flavor=_SavedKerasFlavor(described),
              run_id=run_id, model_id=model_id,
              signature=infer_signature(described["example"], described["output"]),
              input_example=described["example"], pip_requirements=pip_requirements,
              validate_serving_input=False)


class _SavedKerasFlavor:
    """A flavour module for Model.log whose save_model copies the saved file."""

    __name__ = "mlflow.tensorflow"

    def __init__(self, described: dict[str, Any]):
        self._described = described

    def save_model(self, path, mlflow_model, signature, input_example, pip_requirements,
                   validate_serving_input=False):
        import yaml
        from mlflow import pyfunc
        from mlflow.models.utils import _save_example
        from mlflow.utils.environment import _process_pip_requirements, _PythonEnv
        from mlflow.utils.file_utils import get_total_file_size

        d = self._described
        path = os.path.abspath(path)
        os.makedirs(os.path.join(path, DATA))
        _save_example(mlflow_model, input_example, path)
        mlflow_model.signature = signature
        # _MODEL_SAVE_PATH + ".keras" (TensorFlow >= 2.16)
        shutil.copyfile(d["saved"], os.path.join(path, DATA, "model.keras"))
        Path(path, DATA, "keras_module.txt").write_text(d["keras_module"])
        Path(path, DATA, "save_format.txt").write_text(SAVE_FORMAT)
        if d["custom_objects"] is not None:
            Path(path, DATA, "global_custom_objects.cloudpickle").write_bytes(d["custom_objects"])
        mlflow_model.add_flavor("tensorflow", code=None, data=DATA, model_type="keras",
                                keras_version=d["tf_version"], save_format=SAVE_FORMAT)
        pyfunc.add_to_model(mlflow_model, loader_module="mlflow.tensorflow",
                            conda_env="conda.yaml", python_env="python_env.yaml", code=None,
                            data=DATA)
        if size := get_total_file_size(path):
            mlflow_model.model_size_bytes = size
        mlflow_model.save(os.path.join(path, "MLmodel"))
        conda_env, requirements, constraints = _process_pip_requirements(None, pip_requirements, None)
        Path(path, "conda.yaml").write_text(yaml.safe_dump(conda_env, default_flow_style=False))
        if constraints:
            Path(path, "constraints.txt").write_text("\n".join(constraints))
        Path(path, "requirements.txt").write_text("\n".join(requirements))
        _PythonEnv.current().to_yaml(os.path.join(path, "python_env.yaml"))
