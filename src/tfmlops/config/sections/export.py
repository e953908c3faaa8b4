"""export: the served formats, the request caps written into serving.json, the skew report."""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta, field

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ServingLimits(Section):
    """What one request to the served model may cost. Export writes them into
    serving.json; the served model refuses beyond them with HTTP 400, naming the key."""

    max_rows: Annotated[int, Meta(ge=1, le=1_000_000)] = 1024
    # Pixels one image row's header may claim (width x height), checked before decoding.
    max_image_pixels: Annotated[int, Meta(ge=64, le=2**31)] = 4096 * 4096
    # The image rows' header pixels summed over one request: bounds its CPU time.
    max_request_pixels: Annotated[int, Meta(ge=64, le=2**40)] = 64 * 2**20
    # What decoding one request's images holds (header pixels x bytes per pixel of their
    # mode: 2 for 16-bit grey, 3 for RGB, 4 for RGBA; 3 more with transparency or a
    # palette, composited onto white), summed: bounds its memory.
    max_request_decoded_bytes: Annotated[int, Meta(ge=256, le=2**42)] = 256 * 2**20
    # The HTTP request body `tfmlops serve` reads at most (413 beyond, before parsing).
    max_body_bytes: Annotated[int, Meta(ge=1024, le=2**34)] = 16 * 2**20
    # Images one server process decodes at once (the rest wait): bounds its memory.
    max_concurrent_decodes: Annotated[int, Meta(ge=1, le=256)] = 2
    # `tfmlops serve`, per server process: requests on /invocations it reads or answers at
    # once (503 beyond; idle keep-alive connections do not count). Bounds its memory at
    # about this many times (2 x max_body_bytes + the body's parsing).
    max_concurrent_requests: Annotated[int, Meta(ge=1, le=4096)] = 16
    # Seconds a request body may take to arrive in full (408 beyond): a stalled upload
    # holds its slot and its bytes no longer than this.
    body_timeout_s: Annotated[float, Meta(ge=0.1, le=3600)] = 30.0
    # JSON values (counted by their separators) a body may hold, checked before parsing
    # (413 beyond): MLflow's parsing holds about 120 bytes per value, a float array ~15x its body.
    max_json_values: Annotated[int, Meta(ge=16, le=2**31)] = 2**19

    def _rules(self):  # one image fits a request
        if self.max_image_pixels > self.max_request_pixels:
            raise Rule(f"{{p}}max_image_pixels {self.max_image_pixels} is above "
                       f"{{p}}max_request_pixels {self.max_request_pixels}; one image must fit "
                       "in a request")


class SkewLimits(Section):
    """export's skew report: how many original files it follows through both paths, and the
    top-1 agreement they must keep (the stored JPEG's re-encoding is the one difference
    between prepare's path and the served model's on an original file)."""

    source_images: Annotated[int, Meta(ge=0, le=100_000)] = 64  # 0: the source pair is not measured
    source_min_agreement: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.95
    # The SavedModel's in-graph decoding vs prepare's (Pillow, OpenCV) on the originals.
    source_max_grey_levels: Annotated[int, Meta(ge=0, le=255)] = 1


class ExportConfig(Section):
    model_name: Text = "digits"  # one folder name: saved_model/<model_name>/<version>
    onnx_opset: Annotated[int, Meta(ge=9, le=23)] = 17
    atol: Annotated[float, Meta(ge=0.0, le=1.0)] = 1e-4
    latency_runs: Annotated[int, Meta(ge=1, le=1_000_000)] = 200
    serving: ServingLimits = field(default_factory=ServingLimits)
    skew: SkewLimits = field(default_factory=SkewLimits)

    def _rules(self):
        # model_name becomes a path under paths.export: "../x" or "a/b" would write elsewhere.
        if not MODEL_NAME.fullmatch(self.model_name):
            raise Rule(f"{{p}}model_name: {self.model_name!r} is not a plain name; use letters, "
                       "digits, '.', '_' and '-', starting with a letter or digit (no '/' or '..')")
