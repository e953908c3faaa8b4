"""Training/serving skew: every served path against Keras on what training reads.

`export` writes one row per pair to `reports/export.json` (metrics
`skew.<pair>.max_abs_diff` and `skew.<pair>.top1_agreement`) and the whole
report to its MLflow run (`skew.json`):

- `saved_model`, `onnx`, `tflite_edge`: the runtime on the pipeline's own float
  tensors of the test split;
- `saved_model_bytes`, `served_pyfunc`: the SavedModel's image-bytes signature
  and the served MLflow model on the test split's stored bytes. Both decode as
  training does (`pipeline.decode_stored`: libjpeg's accurate integer DCT, which
  Pillow uses too), so the pixels are the same and the bound is `export.atol`;
- `source_served_pyfunc`: a sample of the original files (EXIF-rotated ones
  first) through `prepare`'s path (decode, reduce, store, decode the stored
  bytes, Keras) against the served model on the same original bytes. The two
  differ by the stored JPEG's re-encoding, which serving cannot repeat: the bound
  is a top-1 agreement (`export.skew.source_min_agreement`);
- `source_saved_model_pixels`: on the same originals, the SavedModel's in-graph
  decoding and reduction against prepare's (Pillow and OpenCV), in grey levels:
  two decoders that must differ, bound by `export.skew.source_max_grey_levels`.

The quantized edge TFLite is reported, never gated. A gated pair out of bounds
fails `export` with one line naming the pair.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tfmlops.artifacts import read_manifest
from tfmlops.errors import DataError

log = logging.getLogger(__name__)

EXIF_ORIENTATION = 0x0112
HEADER_SCAN_FACTOR = 8  # headers read per sampled source, to find the EXIF-rotated ones


@dataclass(frozen=True)
class Parity:
    runtime: str
    images: int
    max_abs_diff: float
    top1_mismatches: int
    atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.atol and self.top1_mismatches == 0

    def describe(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        over = self.max_abs_diff - self.atol
        by = f" (over by {over:.3g})" if over > 0 else ""
        return (f"{self.runtime} parity {verdict}: max |{self.runtime} - keras| = "
                f"{self.max_abs_diff:.3g} vs atol {self.atol:g}{by}, "
                f"{self.top1_mismatches} of {self.images} top-1 labels differ")

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def compare(runtime: str, reference: np.ndarray, candidate: np.ndarray, atol: float) -> Parity:
    """`candidate` probabilities [N, K] against the Keras `reference` [N, K]: parity means
    on every image a largest absolute difference of at most `atol` and the same top-1."""
    if reference.shape != candidate.shape:
        raise ValueError(f"{runtime}: output shape {candidate.shape} != keras {reference.shape}")
    diff = float(np.max(np.abs(reference.astype(np.float64) - candidate.astype(np.float64))))
    mismatches = int(np.sum(np.argmax(reference, axis=1) != np.argmax(candidate, axis=1)))
    return Parity(runtime, int(len(reference)), diff, mismatches, float(atol))


@dataclass(frozen=True)
class Pair:
    name: str
    parity: Parity
    min_agreement: float | None = None  # None: bound by max |difference| (parity.atol)
    gated: bool = True
    bound_key: str = "export.atol"  # the param that sets the bound
    unit: str = "probability"  # what max |difference| counts: probability | grey levels

    @property
    def agreement(self) -> float:
        images = self.parity.images
        return 1.0 - self.parity.top1_mismatches / images if images else 1.0

    @property
    def passed(self) -> bool:
        return self.parity.passed if self.min_agreement is None else self.agreement >= self.min_agreement

    def to_dict(self) -> dict:
        bound = ({"min_top1_agreement": self.min_agreement} if self.min_agreement is not None
                 else {"max_abs_diff": self.parity.atol, "top1_mismatches": 0})
        return {"images": self.parity.images, "unit": self.unit, "max_abs_diff": self.parity.max_abs_diff,
                "top1_agreement": round(self.agreement, 6), "bound": bound, "bound_param": self.bound_key,
                "gated": self.gated, "passed": self.passed}

    def describe(self) -> str:
        p = self.parity
        verdict = ("ok" if self.passed else "FAILED") if self.gated else "reported, not gated"
        if self.min_agreement is not None:
            bound = (f"top-1 agreement {self.agreement:.4f} vs at least {self.min_agreement:g} "
                     f"({self.bound_key})")
        elif self.unit == "grey levels":
            bound = f"bound {p.atol:g} ({self.bound_key})"
        else:
            bound = f"bound {p.atol:g} ({self.bound_key}), {p.top1_mismatches} top-1 labels differ"
        return (f"skew keras vs {self.name} {verdict}: max |difference| {p.max_abs_diff:.3g} "
                f"{self.unit} over {p.images} images; {bound}")


def check(pairs: list[Pair]) -> None:
    """Fail on the first gated pair out of bounds, naming it."""
    for pair in pairs:
        log.info("export: %s", pair.describe())
    for pair in pairs:
        if pair.gated and not pair.passed:
            raise DataError(f"training/serving skew: {pair.describe()}; find what this path "
                            "decodes or preprocesses differently from training")


def report(pairs: list[Pair], sources: dict) -> dict:
    return {"pairs": {p.name: p.to_dict() for p in pairs}, "source_sample": sources,
            "decoding": "stored JPEG: libjpeg accurate integer DCT on every path "
                        "(tf.io.decode_jpeg INTEGER_ACCURATE, Pillow); PNG lossless"}


def skew_metrics(pairs: list[Pair]) -> dict[str, float]:
    return {**{f"skew.{p.name}.max_abs_diff": p.parity.max_abs_diff for p in pairs},
            **{f"skew.{p.name}.top1_agreement": round(p.agreement, 6) for p in pairs}}


def pyfunc_probabilities(model, encoded: list[bytes], rows: int) -> np.ndarray:
    """The served MLflow model's probabilities for encoded images, `rows` per request."""
    import pandas as pd

    from tfmlops.stages.export.mlflow_model import request_example

    out = []
    for i in range(0, len(encoded), rows):
        answer = model.predict(pd.DataFrame([request_example(b) for b in encoded[i:i + rows]]))
        out.append(np.asarray(answer["probabilities"].tolist(), np.float32))
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def source_pairs(prepared, keras_model, served, limits) -> tuple[list[Pair], dict]:
    """The two `source_` pairs on up to `limits.source_images` original files, and what was
    sampled. EXIF-rotated files are left out of the pixels pair: the graph does not read EXIF.
    """
    manifest = read_manifest(prepared.folder)
    files, rotated = sample_sources(manifest, limits.source_images)
    facts = {"images": len(files), "exif_rotated": len(rotated), "image_dir": manifest["image_dir"]}
    if not files:
        log.warning("export: the source files under %s are not here: the source skew is not "
                    "measured", manifest["image_dir"])
        return [], facts
    originals = [Path(f).read_bytes() for f in files]
    ours, kept = prepare_inputs(manifest, prepared, originals)
    facts["images"] = len(kept)
    if not kept:
        return [], facts
    reference = np.asarray(keras_model.predict(ours, batch_size=256, verbose=0), np.float32)
    candidate = pyfunc_probabilities(served, [originals[i] for i in kept], 1)
    pairs = [Pair("source_served_pyfunc", compare("source_served_pyfunc", reference, candidate, 0.0),
                  min_agreement=limits.source_min_agreement,
                  bound_key="export.skew.source_min_agreement")]
    upright = [originals[i] for i in kept if files[i] not in rotated]
    grey = graph_decoding_difference(manifest, upright)
    facts["saved_model_pixels"] = {"images": len(upright), "max_grey_levels": grey}
    if upright:
        pairs.append(Pair("source_saved_model_pixels",
                          Parity("source_saved_model_pixels", len(upright), float(grey), 0,
                                 float(limits.source_max_grey_levels)),
                          bound_key="export.skew.source_max_grey_levels", unit="grey levels"))
    return pairs, facts


def graph_decoding_difference(manifest: dict, originals: list[bytes]) -> int:
    """The largest |SavedModel's in-graph decoding - prepare's| in grey levels."""
    import tensorflow as tf

    from tfmlops.serving.preprocess import decode_image
    from tfmlops.stages.export.signatures import decode_like_prepare

    channels, short_side = manifest["channels"], manifest["stored"]["short_side"]
    worst = 0
    for data in originals:
        ours = decode_image(data, channels, short_side)
        graph = decode_like_prepare(tf.constant(data), channels, short_side).numpy()
        if graph.shape != ours.shape:
            return 255  # another size: as different as images get
        worst = max(worst, int(np.max(np.abs(graph.astype(np.int16) - ours.astype(np.int16)))))
    return worst


def sample_sources(manifest: dict, limit: int) -> tuple[list[str], set[str]]:
    """Up to `limit` source paths spread over the manifest, EXIF-rotated ones first (found
    among HEADER_SCAN_FACTOR x `limit` headers), and which of them are rotated."""
    root = Path(manifest["image_dir"])
    names = [row["file"] for row in manifest["files"]]
    if limit <= 0 or not names or not (root / names[0]).is_file():
        return [], set()
    step = max(1, len(names) // (limit * HEADER_SCAN_FACTOR))
    candidates = [str(root / n) for n in names[::step]]
    turned = {f for f in candidates if _orientation(f) not in (None, 1)}
    rotated = [f for f in candidates if f in turned][:max(1, limit // 4)]
    # Only upright files spread the rest: a rotated one past the cap counted as upright
    # compared the graph's unrotated decoding with prepare's rotated one (255 grey levels).
    rest = [f for f in candidates if f not in turned]
    spread = rest[::max(1, len(rest) // max(1, limit - len(rotated)))]
    return (rotated + spread)[:limit], set(rotated)


def _orientation(path: str) -> int | None:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.getexif().get(EXIF_ORIENTATION)
    except Exception:  # noqa: BLE001 - a quarantined file: not in the sample
        return None


def prepare_inputs(manifest: dict, prepared, originals: list[bytes]):
    """Each original through prepare's own path: the float inputs training would read
    and the indices of the files prepare keeps (a quarantined one is left out)."""
    import tensorflow as tf

    from tfmlops.data.pipeline import decode_stored, preprocess
    from tfmlops.data.store import StoreSpec, store_bytes

    stored = manifest["stored"]
    spec = StoreSpec(manifest["channels"], stored["short_side"], stored["encoding"],
                     stored["jpeg_quality"], manifest["image_size"])
    xs, kept = [], []
    for i, data in enumerate(originals):
        result = store_bytes(data, spec)
        if not result.ok:
            continue
        image = decode_stored(tf.constant(result.data), prepared.channels)
        xs.append(preprocess(image, prepared.image_size, prepared.mean, prepared.std).numpy())
        kept.append(i)
    return (np.stack(xs).astype(np.float32) if xs else np.zeros((0, *prepared.input_shape), np.float32)), kept
