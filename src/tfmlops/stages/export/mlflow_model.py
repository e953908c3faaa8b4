"""The pyfunc serving model as MLflow logs it (export, in its run) or saves it (export's
check of the served path, the serving benchmarks): what `mlflow models serve` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfmlops import tracking


def log_serving_model(run: tracking.StageRun, folder: Path, runtime_file: str,
                      example: dict[str, Any]) -> str | None:
    """Log the pyfunc serving model (models-from-code) in `run`; returns its model URI."""
    result: dict[str, str] = {}

    def log(mlflow):
        info = mlflow.pyfunc.log_model(name="model", **_serving_model(folder, runtime_file, example))
        result["uri"] = info.model_uri

    run.call(log, "serving model")
    return result.get("uri")


def request_example(image: bytes) -> dict[str, str]:
    """One request row of the served model for encoded image bytes."""
    import base64

    return {"image": base64.b64encode(image).decode()}


def save_serving_model(folder: Path, runtime_file: str, example: dict[str, Any], dest: Path):
    """The same pyfunc serving model saved in `dest` and loaded back as `mlflow models serve`
    loads it: export checks the served path on it before anything is registered."""
    mlflow = tracking.import_mlflow()
    mlflow.pyfunc.save_model(path=str(dest), **_serving_model(folder, runtime_file, example))
    return mlflow.pyfunc.load_model(str(dest))


def _serving_model(folder: Path, runtime_file: str, example: dict[str, Any]) -> dict[str, Any]:
    """What the served pyfunc model is made of, wherever it is logged or saved."""
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    import tfmlops
    from tfmlops.artifacts import SERVING
    from tfmlops.serving.predictor import CONFIG_ARTIFACT, MODEL_ARTIFACT

    package = Path(tfmlops.__file__).parent
    inputs = Schema([
        ColSpec("string", "image", required=False),  # base64 PNG/JPEG bytes
        # H*W*C floats, row-major, normalized: flat, so MLflow checks it in one vector op
        ColSpec(Array("double"), "pixels", required=False),
    ])
    outputs = Schema([ColSpec("string", "label"), ColSpec("long", "label_index"),
                      ColSpec(Array("double"), "probabilities")])
    return {
        # models-from-code: MLflow runs this file at load time (no pickle); the
        # package travels along as code so the model loads where tfmlops is absent.
        "python_model": str(package / "serving" / "pyfunc_model.py"),
        "artifacts": {MODEL_ARTIFACT: str(folder / runtime_file),
                      CONFIG_ARTIFACT: str(folder / SERVING)},
        "code_paths": [str(package)],
        "signature": ModelSignature(inputs=inputs, outputs=outputs),
        "input_example": pd.DataFrame([example]),
        "pip_requirements": tracking.pinned_requirements(
            "mlflow", "numpy", "pandas", "Pillow", "opencv-python-headless", "onnxruntime",
            "ai-edge-litert"),
    }
