"""The MLflow pyfunc model `mlflow models serve` runs, logged from code (no pickle).

Loading needs no pickle, so it works with MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false
(`mlflow_model` says what is logged with it). A bad request raises an
MlflowException with INVALID_PARAMETER_VALUE: the server answers 400 with the
one-line reason alone (no stack trace, no echo of the request) and keeps
serving; an unexpected failure is logged here with its traceback and answered
500 with one line.
"""

from __future__ import annotations

import logging

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from tfmlops.serving.predictor import CONFIG_ARTIFACT, MODEL_ARTIFACT, Predictor, RequestError

log = logging.getLogger(__name__)


class Refused(MlflowException):
    """An error answer whose message stays the reason it was raised with: MLflow's scoring
    server rewrites the message of an MlflowException that predict raises into "Failed to
    predict data '<the request as a DataFrame>'. Error: ..." (several lines, the client's
    payload echoed back), so later assignments are ignored."""

    @property
    def message(self):
        return self._reason

    @message.setter
    def message(self, value):
        if not hasattr(self, "_reason"):
            self._reason = value


class ImageClassifier(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.predictor = Predictor.from_files(context.artifacts[MODEL_ARTIFACT],
                                              context.artifacts[CONFIG_ARTIFACT])

    # The hint is what MLflow's scoring server passes; a DataFrame hint asks MLflow for no
    # validation by type hint (the logged signature does it) and silences its warning.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        if isinstance(model_input, pd.DataFrame):
            rows = model_input.to_dict(orient="records")
        elif isinstance(model_input, dict):
            rows = [model_input]
        else:
            rows = list(model_input)
        try:
            return pd.DataFrame(self.predictor.predict_rows(rows))
        except RequestError as exc:
            raise Refused(str(exc), error_code=INVALID_PARAMETER_VALUE) from None
        except Exception as exc:  # noqa: BLE001 - the traceback goes to the log, not the client
            log.exception("tfmlops serving: a request failed unexpectedly")
            raise Refused(f"the model failed on this request ({type(exc).__name__}); the "
                          "server's log has the details", error_code=INTERNAL_ERROR) from None


mlflow.models.set_model(ImageClassifier())
