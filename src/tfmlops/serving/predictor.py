"""The served model's core: request rows in, probabilities and labels out.

No TensorFlow and no MLflow here. A request is a table of rows, each with either
- `image`: base64 PNG/JPEG (GIF/BMP) bytes, any size, grayscale or colour, or
- `pixels`: one preprocessed (normalized) float image, flattened row-major from
  [height][width][channels] (a flat array: MLflow validates it in one vector
  operation, a nested one element by element, far slower).
Every row is checked before any inference, so a bad row refuses the whole
request with one clear line (`RequestError`) and nothing else is affected.
What a request may cost is capped by `export.serving` (rows, header pixels
per image, header pixels and decoded bytes per request), from `serving.json`:
every image's header is read and counted before the first pixel of any is
decoded, and at most `max_concurrent_decodes` images decode at once in one
server process, whatever the number of concurrent requests.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np

from tfmlops.serving.preprocess import RequestError, decode_base64, image_header, image_input

MODEL_ARTIFACT, CONFIG_ARTIFACT = "model", "config"  # the pyfunc model's artifact names
REQUEST_HELP = ('send {"dataframe_records": [{"image": "<base64 PNG or JPEG>"}]} '
                'or {"dataframe_records": [{"pixels": [<height*width*channels floats>]}]}')


class Predictor:
    def __init__(self, runtime: str, model_path: str | Path, config: dict):
        from tfmlops.config import ServingLimits
        from tfmlops.runtimes import OnnxModel, TFLiteModel

        self.runtime = runtime
        self.classes = list(config["classes"])
        self.image_size = int(config["image_size"])
        self.channels = int(config["channels"])
        self.mean, self.std = config["mean"], config["std"]
        # prepare's stored short side: a request image is reduced the same way (None: not)
        self.stored_size = config.get("stored_size")
        # export.serving from serving.json; a model exported before the caps gets the defaults
        self.limits = ServingLimits(**(config.get("limits") or {}))
        model_class = TFLiteModel if runtime == "tflite" else OnnxModel
        self.model = model_class(str(model_path), int(config.get("threads", 1)))
        self._lock = threading.Lock()  # a LiteRT interpreter is not thread-safe
        self._decoding = threading.BoundedSemaphore(self.limits.max_concurrent_decodes)

    @classmethod
    def from_files(cls, model_path: str | Path, config_path: str | Path) -> Predictor:
        config = json.loads(Path(config_path).read_text())
        return cls(config["runtime"], model_path, config)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        with self._lock:
            return self.model.predict(x.astype(np.float32, copy=False))

    def image_input(self, data: bytes) -> np.ndarray:
        """Encoded image bytes -> this model's float input, as training saw such an image."""
        with self._decoding:
            return image_input(data, self.channels, self.image_size, self.mean, self.std,
                               self.stored_size, self.limits.max_image_pixels)

    def inputs(self, rows: list[dict]) -> np.ndarray:
        """Request rows -> float32 [N, H, W, C]; raises RequestError naming the bad row.
        Every row is parsed and its header counted before any image is decoded."""
        if not rows:
            raise RequestError(f"the request holds no rows; {REQUEST_HELP}")
        cap = self.limits
        if len(rows) > cap.max_rows:
            raise RequestError(f"{len(rows)} rows in one request; send at most {cap.max_rows} "
                               "(export.serving.max_rows)")
        parsed = [self._checked(i, self._parse, row) for i, row in enumerate(rows)]
        total, held = (sum(cost[k] for _, _, cost in parsed) for k in (0, 1))
        if total > cap.max_request_pixels:
            raise RequestError(f"the request's images claim {total:,} pixels in all; send at most "
                               f"{cap.max_request_pixels:,} per request "
                               "(export.serving.max_request_pixels): fewer or smaller images")
        if held > cap.max_request_decoded_bytes:
            raise RequestError(f"the request's images decode to {held:,} bytes in all; send at most "
                               f"{cap.max_request_decoded_bytes:,} per request (export.serving."
                               "max_request_decoded_bytes): fewer, smaller or 8-bit images")
        return np.stack([self._checked(i, self.image_input, value) if kind == "image" else value
                         for i, (kind, value, _) in enumerate(parsed)])

    @staticmethod
    def _checked(i: int, step, item):
        try:
            return step(item)
        except RequestError as exc:
            raise RequestError(f"row {i}: {exc}") from None

    def _parse(self, row: dict) -> tuple[str, object, tuple[int, int]]:
        """("image", bytes, (header pixels, decoded bytes)) or ("pixels", floats, (0, 0))."""
        image, pixels = _present(row.get("image")), _present(row.get("pixels"))
        if image is not None and pixels is not None:
            raise RequestError("has both 'image' and 'pixels'; send one of them")
        if image is not None:
            data = decode_base64(image)
            width, height, held = image_header(data)
            cap = self.limits.max_image_pixels
            if width * height > cap:
                raise RequestError(f"'image' of {width}x{height} = {width * height:,} pixels is "
                                   f"too large; send at most {cap:,} pixels per image "
                                   "(export.serving.max_image_pixels)")
            return "image", data, (width * height, held)
        if pixels is not None:
            return "pixels", self._pixels(pixels), (0, 0)
        raise RequestError(f"has neither 'image' nor 'pixels'; {REQUEST_HELP}")

    def _pixels(self, pixels) -> np.ndarray:
        h, w, c = shape = (self.image_size, self.image_size, self.channels)
        try:
            x = np.asarray(_nested_list(pixels), dtype=np.float32)
        except (TypeError, ValueError):
            raise RequestError(f"'pixels' must be an array of {h * w * c} numbers") from None
        if x.shape == (h * w * c,):
            x = x.reshape(shape)
        elif x.shape != shape:
            given = "x".join(map(str, x.shape)) or "scalar"
            raise RequestError(f"'pixels' holds {x.size} values (shape {given}); the model takes {h * w * c} "
                               f"= {h}x{w}x{c} (height x width x channels, row-major), normalized")
        if not np.all(np.isfinite(x)):
            raise RequestError("'pixels' holds NaN or infinite values")
        return x

    def predict_rows(self, rows: list[dict]) -> dict[str, list]:
        probs = self.probabilities(self.inputs(rows))
        index = np.argmax(probs, axis=1)
        return {"label": [self.classes[i] for i in index], "label_index": [int(i) for i in index],
                "probabilities": [[float(p) for p in row] for row in probs]}


def _present(value):
    """None for a missing cell (absent column, None or NaN in a mixed table)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _nested_list(value):
    # pandas hands array cells over as (nested) numpy object arrays or lists.
    if isinstance(value, np.ndarray):
        return [_nested_list(v) for v in value] if value.dtype == object else value
    if isinstance(value, (list, tuple)):
        return [_nested_list(v) for v in value]
    return value
