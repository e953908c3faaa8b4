"""The SavedModel for TensorFlow Serving: a client needs no Python preprocessing.

Two signatures over the same Keras 3 model:
- `serve_image_bytes` (also `serving_default`): a batch of encoded PNG/JPEG/BMP
  strings, grayscale or colour, each up to `export.serving.max_image_pixels` as
  its header claims (checked before anything is decoded). GIF, WebP and every other
  format TensorFlow's decode_image reads are refused (`within_cap`): their decoded
  size is not what a header says (`tfmlops serve` takes GIF). Decoding, the channel
  conversion and the reduction `prepare` applies, resizing and normalization all
  run in the graph. EXIF orientation is not read here (the served MLflow model
  applies it, as prepare does): send upright images to TensorFlow Serving.
- `serve_preprocessed`: an already preprocessed float32 [N, H, W, C] tensor.
Both return `probabilities` [N, K], `label_index` [N] and `label` [N] (class name).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfmlops.data.decode import AREA_FROM
from tfmlops.data.pipeline import preprocess

BYTES_SIGNATURE = "serve_image_bytes"
FLOAT_SIGNATURE = "serve_preprocessed"


def decode_like_prepare(encoded: tf.Tensor, channels: int, stored_size: int | None = None) -> tf.Tensor:
    """One encoded image -> uint8 [H, W, channels], converted as `prepare` (PIL) converts it
    (transparency onto white, PIL's integer grayscale formula). With `stored_size` (prepare's
    stored short side) it is reduced as `data.decode.load_pixels` reduces it: a JPEG decodes
    at 1/2, 1/4 or 1/8 scale as PIL's draft picks it, then `reduce_short_side`'s filter
    (within one grey level of OpenCV's)."""
    def jpeg():
        if stored_size is not None:
            return _draft_jpeg(encoded, channels, stored_size)
        # PIL decodes JPEG with the accurate integer DCT; TensorFlow's default is the fast one.
        return _convert_like_pil(
            tf.io.decode_jpeg(encoded, channels=0, dct_method="INTEGER_ACCURATE"), channels)

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, lambda: _convert_like_pil(
        tf.io.decode_image(encoded, channels=0, expand_animations=False), channels))
    return image if stored_size is None else reduce_like_prepare(image, stored_size)


PNG_MAGIC, BMP_MAGIC = b"\x89PNG\r\n\x1a\n", b"BM"
# TensorFlow's decoder sizes a GIF by its largest frame, which no header field bounds (a 1x1
# logical screen may hold a 65535x65535 frame); tf.io.is_gif checks these three bytes.
GIF_MAGIC = b"GIF"


def _starts(encoded: tf.Tensor, magic: bytes) -> tf.Tensor:
    return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)


def header_pixels(encoded: tf.Tensor) -> tf.Tensor:
    """int64 width x height that one encoded image's header claims, no pixel decoded:
    JPEG by its SOF marker, PNG by IHDR (big-endian), BMP by its info header
    (little-endian; a negative height is top-down), the fields TensorFlow's decoders
    size their output by. 0 for other bytes (`within_cap` refuses them)."""
    head = tf.strings.join([tf.strings.substr(encoded, 0, 32), tf.constant(b"\0" * 32)])
    b = tf.cast(tf.io.decode_raw(tf.strings.substr(head, 0, 32), tf.uint8), tf.int64)

    def number(start: int, size: int, big_endian: bool) -> tf.Tensor:
        order = range(size) if big_endian else reversed(range(size))
        value = tf.constant(0, tf.int64)
        for i in order:
            value = value * 256 + b[start + i]
        return value

    def bmp():
        height = number(22, 4, False)
        height = tf.where(height >= 2**31, 2**32 - height, height)  # int32: top-down rows
        return number(18, 4, False) * height

    def jpeg():
        shape = tf.cast(tf.io.extract_jpeg_shape(encoded), tf.int64)
        return shape[0] * shape[1]

    return tf.case([
        (tf.io.is_jpeg(encoded), jpeg),
        (_starts(encoded, PNG_MAGIC), lambda: number(16, 4, True) * number(20, 4, True)),
        (_starts(encoded, BMP_MAGIC), bmp),
    ], default=lambda: tf.constant(0, tf.int64), exclusive=False)


def within_cap(encoded: tf.Tensor, max_pixels: int) -> tf.Tensor:
    """`encoded` once it is known to be PNG, JPEG or BMP and its header is checked against
    `max_pixels` (InvalidArgumentError otherwise). decode_image also reads GIF, WebP and
    JPEG XL, whose decoded size no header check here bounds: they are refused."""
    gif = _starts(encoded, GIF_MAGIC)
    known = tf.io.is_jpeg(encoded) | _starts(encoded, PNG_MAGIC) | _starts(encoded, BMP_MAGIC)
    checks = [
        tf.debugging.assert_equal(gif, False, message="image refused: GIF is not read by this "
                                  "signature (TensorFlow sizes a GIF by its frames, not by its "
                                  "header); send PNG, JPEG or BMP (tfmlops serve takes GIF)"),
        tf.debugging.assert_equal(known | gif, True, message="image refused: not PNG, JPEG or "
                                  "BMP, the formats this signature reads; convert it to one"),
        tf.debugging.assert_less_equal(
            header_pixels(encoded), tf.constant(max_pixels, tf.int64),
            message=f"image refused: its header claims more than {max_pixels} pixels "
                    "(export.serving.max_image_pixels); send a smaller image")]
    with tf.control_dependencies(checks):
        return tf.identity(encoded)


def _draft_jpeg(encoded: tf.Tensor, channels: int, short_side: int) -> tf.Tensor:
    # PIL's JPEG draft: the largest of 8, 4, 2, 1 that keeps both sides >= short_side, and
    # libjpeg's own grayscale output when one channel is asked for.
    shape = tf.io.extract_jpeg_shape(encoded)
    scale = tf.minimum(shape[0] // short_side, shape[1] // short_side)
    index = tf.add_n([tf.cast(scale >= r, tf.int32) for r in (2, 4, 8)])
    return tf.switch_case(index, [lambda r=r: tf.io.decode_jpeg(
        encoded, channels=channels, ratio=r, dct_method="INTEGER_ACCURATE") for r in (1, 2, 4, 8)])


def reduce_like_prepare(image: tf.Tensor, short_side: int) -> tf.Tensor:
    """uint8 [H, W, C] -> its short side at `short_side` when larger (`decode.reduced_size`)."""
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    short = tf.minimum(h, w)

    def reduce():
        scale = short_side / tf.cast(short, tf.float64)
        # tf.round rounds half to even, as Python's round() in reduced_size does.
        size = tf.stack([tf.maximum(short_side, tf.cast(tf.round(tf.cast(n, tf.float64) * scale),
                                                        tf.int32)) for n in (h, w)])
        x = tf.cast(image, tf.float32)
        # decode.reduce_short_side: bilinear below AREA_FROM x, area averaging from it.
        x = tf.cond(short < AREA_FROM * short_side,
                    lambda: tf.image.resize(x, size, method="bilinear"),
                    lambda: tf.image.resize(x, size, method="area"))
        return tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8)

    return tf.cond(short > short_side, reduce, lambda: image)


def _convert_like_pil(image: tf.Tensor, channels: int) -> tf.Tensor:
    image = tf.cast(image, tf.int32)
    n = tf.shape(image)[-1]
    color = tf.cond(n < 3, lambda: tf.tile(image[..., :1], [1, 1, 3]), lambda: image[..., :3])
    alpha = tf.cond(tf.equal(n % 2, 0), lambda: image[..., -1:],
                    lambda: tf.fill(tf.shape(image[..., :1]), 255))
    # PIL's alpha_composite onto opaque white, in its integer arithmetic
    # (coef1 = a*128, SHIFTFORDIV255, PRECISION_BITS = 7): identity when a = 255.
    t = 128 * (color * alpha + 255 * (255 - alpha)) + (128 << 7)
    color = tf.bitwise.right_shift(tf.bitwise.right_shift(tf.bitwise.right_shift(t, 8) + t, 8), 7)
    if channels == 1:  # PIL "L": (R*19595 + G*38470 + B*7471 + 0x8000) >> 16
        weights = tf.constant([19595, 38470, 7471], tf.int32)
        gray = tf.reduce_sum(color * weights, axis=-1, keepdims=True) + 0x8000
        color = tf.bitwise.right_shift(gray, 16)
    return tf.cast(color, tf.uint8)


def export_saved_model(model, path, classes, image_size: int, channels: int, mean, std,
                       stored_size: int | None = None, *, max_pixels: int) -> None:
    """Write the SavedModel; the bytes signature comes first, so it is `serving_default` too."""
    import keras

    names = tf.constant(classes)

    def outputs(probabilities):
        index = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "label_index": index, "label": tf.gather(names, index)}

    def serve_preprocessed(image):
        return outputs(tf.cast(model(image, training=False), tf.float32))

    def serve_image_bytes(image_bytes):
        def one(b):
            image = decode_like_prepare(within_cap(b, max_pixels), channels, stored_size)
            return preprocess(image, image_size, mean, std)

        spec = tf.TensorSpec((image_size, image_size, channels), tf.float32)
        return serve_preprocessed(tf.map_fn(one, image_bytes, fn_output_signature=spec))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(BYTES_SIGNATURE, serve_image_bytes, input_signature=[
        tf.TensorSpec([None], tf.string, name="image_bytes")])
    archive.add_endpoint(FLOAT_SIGNATURE, serve_preprocessed, input_signature=[
        tf.TensorSpec([None, image_size, image_size, channels], tf.float32, name="image")])
    archive.write_out(str(path), verbose=False)


def main(argv: list[str]) -> int:
    """`python -m tfmlops.stages.export.signatures DIR SPLIT.json OUTPUTS.npz`: export's reload
    check in a fresh process, both signatures on the split's float inputs and stored bytes."""
    import json

    from tfmlops.data.stored_split import StoredSplit

    path, split_file, outputs = argv
    split = StoredSplit.from_dict(json.loads(Path(split_file).read_text()))
    loaded = tf.saved_model.load(str(path))
    floats, images = loaded.signatures[FLOAT_SIGNATURE], loaded.signatures[BYTES_SIGNATURE]
    prob_f, prob_b, labels = [], [], []
    for encoded, x, _ in split.batches():
        prob_f.append(floats(image=tf.constant(x))["probabilities"].numpy())
        out = images(image_bytes=tf.constant(encoded))
        prob_b.append(out["probabilities"].numpy())
        labels.append(out["label"].numpy().astype(str))
    default = loaded.signatures["serving_default"]
    first = default(image_bytes=tf.constant([split.first[0]]))["probabilities"].numpy()
    np.savez(outputs, float_probabilities=np.concatenate(prob_f), bytes_probabilities=np.concatenate(prob_b),
             bytes_labels=np.concatenate(labels), default_probabilities=first)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
