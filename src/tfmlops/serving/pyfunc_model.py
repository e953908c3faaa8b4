"""The MLflow pyfunc model `mlflow models serve` runs, logged from code (no pickle).

`export` logs this file as `python_model=` (MLflow's models-from-code) with
the runtime file and `serving.json` as artifacts and the `tfmlops` package as
`code_paths`, so loading needs no pickle and works with
MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false. A bad request raises an
MlflowException with INVALID_PARAMETER_VALUE: the server answers 400 with the
reason and keeps serving.
"""

from __future__ import annotations

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from tfmlops.serving.predictor import CONFIG_ARTIFACT, MODEL_ARTIFACT, Predictor, RequestError


class ImageClassifier(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.predictor = Predictor.from_files(context.artifacts[MODEL_ARTIFACT],
                                              context.artifacts[CONFIG_ARTIFACT])

    def predict(self, context, model_input, params=None):
        import pandas as pd

        if isinstance(model_input, pd.DataFrame):
            rows = model_input.to_dict(orient="records")
        elif isinstance(model_input, dict):
            rows = [model_input]
        else:
            rows = list(model_input)
        try:
            return pd.DataFrame(self.predictor.predict_rows(rows))
        except RequestError as exc:
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(ImageClassifier())
