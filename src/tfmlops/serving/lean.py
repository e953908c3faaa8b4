"""`tfmlops serve`'s own path for the project's pyfunc model: JSON rows in, MLflow's bytes out.

MLflow's scoring server turns every request into a pandas DataFrame, checks it against
the model's signature, hands the pyfunc a DataFrame and serializes the DataFrame it
returns: most of a one-image request's time, none of it needed by this model, whose
`Predictor` takes plain rows. Here the rows go to the same `Predictor` straight from
`json.loads`, and the answer is written as MLflow writes it, so its bytes are the same.

Only the shapes whose answer is provably MLflow's are taken (`request_rows`): a JSON
object holding `dataframe_records` or `dataframe_split` alone, every row with the same
single column, `image` a string or `pixels` a flat array of JSON floats. For any other
body (`instances`, `inputs`, `params`, mixed or extra columns, integers where floats
go, ...) `request_rows` says None and MLflow's own path answers, with MLflow's own
conversions and refusals. No pandas and no MLflow here.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np

from tfmlops.serving.predictor import Predictor, RequestError

COLUMNS = {"image": str, "pixels": list}  # the one column a row holds, and its JSON type
# What MLflow's scoring server answers, as it serializes them.
REFUSED_CODE = "INVALID_PARAMETER_VALUE"  # pyfunc_model's Refused for a RequestError
TIMED_OUT = b"Request processing time exceeded limit"  # its timeout middleware's 504


def request_rows(body: bytes, content_type: str = "application/json") -> list[dict] | None:
    """The rows of a request body in a shape this path answers as MLflow's would; None for
    any other body, or a content type MLflow's parser does not read as UTF-8 JSON (MLflow's
    path answers it)."""
    if not _utf8_json(content_type):
        return None
    try:
        data = json.loads(body)  # what MLflow's parser calls on the same bytes
    # JSONDecodeError and UnicodeDecodeError are ValueErrors; a body nested deeper than the
    # interpreter recurses (within max_json_values) raises RecursionError: MLflow's path
    # answers them all as it does today.
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or len(data) != 1:
        return None
    ((key, value),) = data.items()
    if key == "dataframe_records":
        rows = value if isinstance(value, list) else None
    elif key == "dataframe_split":
        rows = _split_rows(value)
    else:
        return None
    if not rows or not _uniform(rows):
        return None
    if "pixels" in rows[0]:  # as MLflow's schema check hands them over: float64 arrays
        rows = [{"pixels": np.asarray(row["pixels"], dtype=np.float64)} for row in rows]
    return rows


def _utf8_json(content_type: str) -> bool:
    """Whether MLflow's `invocations` parses a body of this Content-Type as JSON: its type
    exactly `application/json`, no parameter but `charset`, and that one UTF-8 (MLflow
    answers 415 otherwise), split as MLflow splits it."""
    mime, *parameters = (part.strip() for part in content_type.split(";"))
    pairs = dict(p.partition("=")[::2] for p in parameters)
    return (mime == "application/json" and set(pairs) <= {"charset"}
            and pairs.get("charset", "utf-8").lower() == "utf-8")


def _split_rows(split) -> list[dict] | None:
    """{"columns": [one column], "data": [[value], ...]} -> rows; None for any other shape."""
    if not isinstance(split, dict) or set(split) != {"columns", "data"}:
        return None
    columns, data = split["columns"], split["data"]
    if not isinstance(columns, list) or len(columns) != 1 or not isinstance(data, list):
        return None
    if not all(isinstance(r, list) and len(r) == 1 for r in data):
        return None
    return [{columns[0]: r[0]} for r in data]


def _uniform(rows: list) -> bool:
    """Every row a dict with the same one column of its JSON type, floats alone in `pixels`:
    MLflow's schema check converts integers and booleans there (or refuses them) and reads
    a nested array otherwise, so those bodies are left to it."""
    first = rows[0]
    if not isinstance(first, dict) or len(first) != 1:
        return False
    (column,) = first
    kind = COLUMNS.get(column)
    if kind is None:
        return False
    for row in rows:
        if type(row) is not dict or len(row) != 1 or type(row.get(column)) is not kind:
            return False
        if kind is list and (not row[column] or not all(type(v) is float for v in row[column])):
            return False
    return True


def predictions_body(result: dict[str, list]) -> bytes:
    """`Predictor.predict_rows`' columns -> the bytes of MLflow's answer: the DataFrame the
    pyfunc returns, as records ({column: value} per row, in column order), under
    "predictions", by `json.dump` with its default separators."""
    columns = list(result)
    rows = zip(*result.values(), strict=True)
    records = [dict(zip(columns, values, strict=True)) for values in rows]
    return json.dumps({"predictions": records}).encode()


class LeanPath:
    """Answers POST /invocations bodies for a tfmlops `Predictor`, in a worker thread (as
    MLflow predicts) within MLflow's request timeout (`timeout_s`)."""

    def __init__(self, predictor: Predictor, timeout_s: float):
        self.predictor, self.timeout_s = predictor, timeout_s

    async def respond(self, body: bytes, content_type: str) -> tuple[int, bytes] | None:
        """(status, body as MLflow's app sends it), or None: MLflow's path answers this one
        (a body of another shape, or an unexpected failure, which it logs and answers)."""
        rows = request_rows(body, content_type)
        if rows is None:
            return None
        try:
            result = await asyncio.wait_for(asyncio.to_thread(self.predictor.predict_rows, rows),
                                            self.timeout_s)
        except RequestError as exc:
            return 400, json.dumps({"error_code": REFUSED_CODE, "message": str(exc)}).encode()
        except TimeoutError:
            return 504, TIMED_OUT
        except Exception:  # noqa: BLE001 - MLflow's path logs it with its traceback and answers
            return None
        return 200, predictions_body(result)
