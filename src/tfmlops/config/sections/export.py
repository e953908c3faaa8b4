"""export: the served formats, the request caps written into serving.json, the skew report."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Float, Int, Text, section

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@section
class ServingLimits:
    """What one request to the served model may cost. Export writes them into
    serving.json; the served model refuses beyond them with HTTP 400, naming the key."""

    max_rows: Int = Field(1024, ge=1, le=1_000_000)
    # Pixels one image row's header may claim (width x height), checked before decoding.
    max_image_pixels: Int = Field(4096 * 4096, ge=64, le=2**31)
    # The image rows' header pixels summed over one request: bounds its CPU time.
    max_request_pixels: Int = Field(64 * 2**20, ge=64, le=2**40)
    # What decoding one request's images holds (header pixels x bytes per pixel of their
    # mode: 2 for 16-bit grey, 3 for RGB, 4 for RGBA), summed: bounds its memory.
    max_request_decoded_bytes: Int = Field(256 * 2**20, ge=256, le=2**42)
    # The HTTP request body `tfmlops serve` reads at most (413 beyond, before parsing).
    max_body_bytes: Int = Field(64 * 2**20, ge=1024, le=2**34)
    # Images one server process decodes at once (the rest wait): bounds its memory.
    max_concurrent_decodes: Int = Field(2, ge=1, le=256)

    @model_validator(mode="after")
    def _one_image_fits_a_request(self):
        if self.max_image_pixels > self.max_request_pixels:
            raise Rule(f"{{p}}max_image_pixels {self.max_image_pixels} is above "
                       f"{{p}}max_request_pixels {self.max_request_pixels}; one image must fit "
                       "in a request")
        return self


@section
class SkewLimits:
    """export's skew report: how many original files it follows through both paths, and the
    top-1 agreement they must keep (the stored JPEG's re-encoding is the one difference
    between prepare's path and the served model's on an original file)."""

    source_images: Int = Field(64, ge=0, le=100_000)  # 0: the source pair is not measured
    source_min_agreement: Float = Field(0.95, ge=0.0, le=1.0)
    # The SavedModel's in-graph decoding vs prepare's (Pillow, OpenCV) on the originals.
    source_max_grey_levels: Int = Field(1, ge=0, le=255)


@section
class ExportConfig:
    model_name: Text = "digits"  # one folder name: saved_model/<model_name>/<version>
    onnx_opset: Int = Field(17, ge=9, le=23)
    atol: Float = Field(1e-4, ge=0.0, le=1.0)
    latency_runs: Int = Field(200, ge=1, le=1_000_000)
    serving: ServingLimits = Field(default_factory=ServingLimits)
    skew: SkewLimits = Field(default_factory=SkewLimits)

    @field_validator("model_name")
    @classmethod
    def _one_folder_name(cls, name):
        # It becomes a path under paths.export: "../x" or "a/b" would write elsewhere.
        if not MODEL_NAME.fullmatch(name):
            raise Rule(f"{{path}}: {name!r} is not a plain name; use letters, digits, '.', "
                       "'_' and '-', starting with a letter or digit (no '/' or '..')")
        return name
