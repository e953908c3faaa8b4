"""Serving decodes a request image as `prepare` decodes a photo (data/decode.py).

A phone's photo (EXIF orientation, MPO, 16-bit PNG, a decompression-bomb
header) gives the served model the input the training path gives it, or a
one-line RequestError: the served model turns that into a 400 with the reason.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from images import png_header
from tfmlops.artifacts import SERVING
from tfmlops.data.decode import load_pixels
from tfmlops.serving.preprocess import RequestError, decode_image, image_input

MEAN, STD = [0.45, 0.5, 0.55], [0.22, 0.25, 0.2]


def photo(width=300, height=200, seed=0) -> Image.Image:
    """A textured colour image (gradients + noise): resizing and JPEG both matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    noisy = base + rng.normal(0, 25, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def jpeg(img: Image.Image, orientation: int | None = None) -> bytes:
    buf = io.BytesIO()
    if orientation is None:
        img.save(buf, "JPEG", quality=90)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation  # Orientation
        img.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


def train_input(data: bytes, channels: int, size: int, stored_size: int | None):
    """prepare's decoding (load_pixels, stored as PNG) + the tf.data pipeline's record
    decoding and preprocessing: what training feeds the model."""
    import tensorflow as tf

    from tfmlops.data import pipeline

    buf = io.BytesIO()
    Image.fromarray(load_pixels(data, channels, short_side=stored_size)[0]).save(buf, "PNG")
    record = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buf.getvalue()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
    })).SerializeToString()
    image, _ = pipeline.decode(tf.constant(record), channels)
    return pipeline.preprocess(image, size, MEAN[:channels], STD[:channels]).numpy()


def test_exif_orientation_is_applied_in_serving():
    img = photo()
    upright = decode_image(jpeg(img), 3)
    # Orientation 6: the stored pixels are to be turned 90 degrees clockwise for display.
    turned = decode_image(jpeg(img, orientation=6), 3)
    assert upright.shape == (200, 300, 3) and turned.shape == (300, 200, 3)
    np.testing.assert_array_equal(turned, np.rot90(upright, k=-1))


@pytest.mark.parametrize("stored_size", [None, 48])
@pytest.mark.parametrize("channels", [1, 3])
def test_a_rotated_jpeg_gives_the_same_model_input_in_training_and_serving(stored_size,
                                                                           channels):
    data = jpeg(photo(seed=1), orientation=6)
    trained = train_input(data, channels, 32, stored_size)
    served = image_input(data, channels, 32, MEAN[:channels], STD[:channels], stored_size)
    assert served.shape == trained.shape == (32, 32, channels)
    np.testing.assert_allclose(served, trained, atol=1e-5)
    # Not the unrotated image's input: orientation reached both paths.
    flat = image_input(jpeg(photo(seed=1)), channels, 32, MEAN[:channels], STD[:channels],
                       stored_size)
    assert np.abs(flat - served).mean() > 0.1


def test_the_stored_size_reduces_a_request_before_the_final_resize():
    data = jpeg(photo(640, 480, seed=2))
    reduced = decode_image(data, 3, stored_size=48)
    assert reduced.shape == (48, 64, 3)
    full = image_input(data, 3, 32, MEAN, STD)
    small = image_input(data, 3, 32, MEAN, STD, stored_size=48)
    assert not np.allclose(full, small)  # the reduction matters: it must match training's


def test_a_16_bit_png_is_scaled_not_clipped():
    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (8, 1))
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, "PNG")
    assert Image.open(io.BytesIO(buf.getvalue())).mode.startswith("I")
    for channels in (1, 3):
        out = decode_image(buf.getvalue(), channels)
        assert out.shape == (8, 64, channels)
        expected = np.round(ramp.astype(np.float64) * 255 / 65535)
        np.testing.assert_allclose(out[..., 0], expected, atol=1)
        assert out.min() == 0 and out.max() == 255 and len(np.unique(out)) == 64


def test_an_mpo_is_accepted_and_its_first_picture_used():
    first, second = photo(seed=3), photo(seed=4).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[second], quality=90)
    assert Image.open(io.BytesIO(buf.getvalue())).format == "MPO"
    served = decode_image(buf.getvalue(), 3)
    np.testing.assert_array_equal(served, decode_image(jpeg(first), 3))
    trained = train_input(buf.getvalue(), 3, 32, 48)
    np.testing.assert_allclose(image_input(buf.getvalue(), 3, 32, MEAN, STD, 48), trained,
                               atol=1e-5)


@pytest.mark.parametrize("side", [10_000, 30_000])  # above PIL's limit (warning) and twice it
def test_a_decompression_bomb_header_is_a_one_line_request_error(side):
    with pytest.raises(RequestError) as caught:
        decode_image(png_header(side, side), 3)
    message = str(caught.value)
    assert "decompression bomb" in message and "\n" not in message
    # Raised `from None`: the reason alone, no chained PIL traceback behind it.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_served_model_carries_the_stored_size(tmp_path):
    from tfmlops.data.pipeline import Prepared
    from tfmlops.stages.export.formats import write_serving_config

    prepared = Prepared(tmp_path, ["a", "b"], {"train": 1, "val": 1, "test": 1}, 32, 3,
                        MEAN, STD, stored_size=48)
    write_serving_config(tmp_path, {"runtime": "onnx", "file": "model.onnx"}, prepared)
    config = json.loads((tmp_path / SERVING).read_text())
    assert config["stored_size"] == 48 and config["image_size"] == 32
    full = Prepared(tmp_path, ["a", "b"], {"train": 1, "val": 1, "test": 1}, 32, 3, MEAN, STD)
    write_serving_config(tmp_path, {"runtime": "onnx", "file": "model.onnx"}, full)
    assert json.loads((tmp_path / SERVING).read_text())["stored_size"] is None


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("stored_size", [None, 48])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_savedmodels_in_graph_decoding_reduces_as_prepare_does(stored_size, channels):
    """TensorFlow Serving's path: JPEG draft scale + antialiased reduction in the graph,
    within one grey level of PIL's (exact without a stored size)."""
    import tensorflow as tf

    from tfmlops.stages.export.signatures import decode_like_prepare

    decode = tf.function(lambda b: decode_like_prepare(b, channels, stored_size))
    for data in (jpeg(photo(640, 480, seed=5)), jpeg(photo(210, 500, seed=6)),
                 png(photo(300, 200, seed=7)), jpeg(photo(40, 30, seed=8))):
        graph = decode(tf.constant(data)).numpy().astype(int)
        pil = decode_image(data, channels, stored_size).astype(int)
        assert graph.shape == pil.shape
        assert np.abs(graph - pil).max() <= (0 if stored_size is None else 1)


# ------------------------------------------- request cost (issue 14, item 5)

def _resize_float_first(image_uint8: np.ndarray, size: int) -> np.ndarray:
    """The former path, kept as the reference: the whole image to float32, then the taps."""
    from tfmlops.data.decode import bilinear_taps

    image = image_uint8.astype(np.float32)
    y_lo, y_hi, y_lerp = bilinear_taps(image.shape[0], size)
    x_lo, x_hi, x_lerp = bilinear_taps(image.shape[1], size)
    x_lerp = x_lerp[None, :, None]
    top, bottom = image[y_lo], image[y_hi]
    top = top[:, x_lo] + (top[:, x_hi] - top[:, x_lo]) * x_lerp
    bottom = bottom[:, x_lo] + (bottom[:, x_hi] - bottom[:, x_lo]) * x_lerp
    return top + (bottom - top) * y_lerp[:, None, None]


@pytest.mark.parametrize("shape, size", [((200, 300, 3), 32), ((37, 53, 1), 16),
                                         ((8, 5, 3), 32), ((16, 16, 1), 16), ((1, 999, 3), 7)])
def test_the_8_bit_resize_gives_exactly_the_float_first_numbers(shape, size):
    from tfmlops.serving.preprocess import normalize, resize_bilinear

    image = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    expected = _resize_float_first(image, size)
    got = resize_bilinear(image, size)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    c = shape[2]
    reference = (expected / np.float32(255.0) - np.asarray(MEAN[:c], np.float32)) \
        / np.asarray(STD[:c], np.float32)
    np.testing.assert_array_equal(normalize(image, size, MEAN[:c], STD[:c]), reference)


def test_a_big_request_image_is_never_converted_to_float_whole():
    """Peak memory of resizing a 2048x2048 RGB image to 32x32: the taps only (a few
    KB), not the 48 MB float32 copy of the whole image the former path made."""
    import tracemalloc

    from tfmlops.serving.preprocess import normalize

    image = np.random.default_rng(0).integers(0, 256, (2048, 2048, 3), dtype=np.uint8)
    tracemalloc.start()
    try:
        normalize(image, 32, MEAN, STD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak


def test_export_writes_the_request_caps_into_serving_json(tmp_path):
    from tfmlops.data.pipeline import Prepared
    from tfmlops.stages.export.formats import write_serving_config

    prepared = Prepared(tmp_path, ["a", "b"], {"train": 1, "val": 1, "test": 1}, 32, 3,
                        MEAN, STD)
    caps = {"max_rows": 3, "max_image_pixels": 100, "max_request_pixels": 250}
    write_serving_config(tmp_path, {"runtime": "onnx", "file": "model.onnx"}, prepared, caps)
    assert json.loads((tmp_path / SERVING).read_text())["limits"] == caps
    write_serving_config(tmp_path, {"runtime": "onnx", "file": "model.onnx"}, prepared)
    assert json.loads((tmp_path / SERVING).read_text())["limits"] == {
        "max_rows": 1024, "max_image_pixels": 4096 * 4096, "max_request_pixels": 64 * 2**20,
        "max_request_decoded_bytes": 256 * 2**20, "max_body_bytes": 16 * 2**20,
        "max_concurrent_decodes": 2, "max_concurrent_requests": 16, "body_timeout_s": 30.0,
        "max_json_values": 2**19}


# ------------------------- 16-bit images, decoded bytes, concurrent decodes, plugins

def png16(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array.astype(np.uint16)).save(buf, "PNG")
    return buf.getvalue()


def test_a_16_bit_image_decodes_without_wide_temporaries():
    """A 2048x2048 16-bit PNG (4 Mi pixels) scaled to 8 bits: the former int64 path held
    several 32 MB temporaries at once (16 bytes per pixel and more); through the lookup
    table, PIL's raw 16-bit bytes (joined from chunks: twice 8 MB for a moment) and the
    8-bit result (4 MB)."""
    import tracemalloc

    from tfmlops.data.decode import load_pixels

    data = png16(np.zeros((2048, 2048)))
    tracemalloc.start()
    try:
        load_pixels(data, 1, short_side=32)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * 2048 * 2048, peak


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-70000, 140000), min_size=1, max_size=64),
       mode=st.sampled_from(["I;16", "I;16B", "I"]))
def test_the_16_bit_table_scales_exactly_as_the_arithmetic_did(values, mode):
    """Prepare's stored pixels must not change: the table gives round(v*255/65535) clipped,
    the formula the int64 path computed, for every mode PIL gives 16-bit images."""
    from tfmlops.data.decode import to_channels

    wide = np.asarray(values, np.int64)
    if mode != "I":
        wide = np.clip(wide, 0, 65535)
    dtype = {"I;16": "<u2", "I;16B": ">u2", "I": "<i4"}[mode]
    img = Image.frombuffer(mode, (len(values), 1), wide.astype(dtype).tobytes(), "raw", mode,
                           0, 1)
    expected = np.clip((wide * 255 + 32767) // 65535, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(to_channels(img, 1))[0], expected)


def test_a_request_of_16_bit_images_is_capped_by_its_decoded_bytes(tmp_path):
    """Four 4096x4096 16-bit PNGs pass the pixel caps (64 Mi pixels) but decode to 128 MiB;
    a cap of 100 MiB refuses them before any is decoded, naming the param."""
    import base64

    from tfmlops.serving.predictor import Predictor

    config = {"classes": ["a", "b"], "image_size": 8, "channels": 1, "mean": [0.5],
              "std": [0.5], "limits": {"max_request_decoded_bytes": 100 * 2**20}}
    predictor = Predictor.__new__(Predictor)  # the caps alone: no runtime is needed
    predictor.channels, predictor.image_size = 1, 8
    from tfmlops.config import ServingLimits

    predictor.limits = ServingLimits(**config["limits"])
    row = {"image": base64.b64encode(png16(np.zeros((4096, 4096)))).decode()}
    with pytest.raises(RequestError) as caught:
        predictor.inputs([row] * 4)
    assert str(caught.value) == (
        "the request's images decode to 134,217,728 bytes in all; send at most 104,857,600 per "
        "request (export.serving.max_request_decoded_bytes): fewer, smaller or 8-bit images")


def palette_png(side: int, transparent: bool = True) -> bytes:
    """A side x side palette PNG (a few KB at any size), index 0 transparent (tRNS)."""
    img = Image.new("P", (side, side), 0)
    img.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    buf = io.BytesIO()
    img.save(buf, "PNG", **({"transparency": 0} if transparent else {}))
    return buf.getvalue()


# In a fresh process: decode one small palette PNG (OpenCV's threads, Pillow's first use),
# reset the peak RSS (/proc/self/clear_refs), then report what load_pixels added at its
# peak for one image, per channel count, with the bytes decoded_bytes charges for it.
PEAK = """
import json, sys
from pathlib import Path
from tfmlops.data.decode import decoded_bytes, load_pixels, open_image

def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

small, big = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]).read_bytes()
load_pixels(small, 3, short_side=32)
peaks = {}
for channels in (3, 1):
    Path("/proc/self/clear_refs").write_text("5")
    base = status("VmRSS")
    load_pixels(big, channels, short_side=96)
    peaks[channels] = status("VmHWM") - base
print(json.dumps({"charged": decoded_bytes(open_image(big)), "peaks": peaks}))
"""


def test_a_transparent_palette_image_costs_no_more_than_it_is_charged(tmp_path):
    """A 17 KB 4096x4096 palette PNG with tRNS was charged 16 MB (1 byte per pixel) while its
    RGBA conversion, white canvas and composite held +300 MB at load_pixels' peak. It is now
    composited band by band into the result array, and charged that array too: the peak RSS
    it adds (measured in a fresh process) stays within what max_request_decoded_bytes counts."""
    import subprocess
    import sys

    (tmp_path / "small.png").write_bytes(palette_png(64))
    (tmp_path / "big.png").write_bytes(palette_png(4096))
    run = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "small.png"),
                          str(tmp_path / "big.png")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["charged"] < 80 * 2**20, result  # 4 bytes per pixel and one band: not 16
    for channels, peak in result["peaks"].items():
        assert peak <= result["charged"], (channels, result)


@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(["P", "PA", "LA", "RGBA", "L", "RGB", "1"]),
       key=st.booleans(), size=st.tuples(st.integers(1, 23), st.integers(1, 23)),
       band=st.integers(1, 60), channels=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_compositing_in_bands_gives_the_whole_images_bytes(mode, key, size, band, channels,
                                                          seed):
    """prepare's stored pixels must not change: band by band onto white (pixels_of) equals
    the whole image's RGBA conversion composited at once (to_channels), byte for byte, for
    every mode that may carry transparency, with or without a colour key (tRNS)."""
    from tfmlops.data.decode import pixels_of, to_channels

    rng = np.random.default_rng(seed)
    bands = {"P": 1, "PA": 2, "LA": 2, "RGBA": 4, "L": 1, "RGB": 3, "1": 1}[mode]
    values = rng.integers(0, 256, (size[1], size[0], bands), np.uint8)
    if mode == "1":
        img = Image.fromarray(values[..., 0] > 127)
    elif mode in ("P", "PA"):
        img = Image.fromarray(values[..., 0], "L").convert("P") if mode == "P" else \
            Image.fromarray(values, "LA").convert("PA")
        img.putpalette(rng.integers(0, 256, 768, np.uint8).tobytes())
    else:
        img = Image.fromarray(values[..., 0] if bands == 1 else values, mode)
    if key and mode == "P":
        img.info["transparency"] = bytes(rng.integers(0, 256, 256, np.uint8))
    elif key and mode in ("L", "RGB"):
        img.info["transparency"] = int(values[0, 0, 0]) if mode == "L" else \
            tuple(int(v) for v in values[0, 0])
    expected = np.asarray(to_channels(img, channels))
    np.testing.assert_array_equal(pixels_of(img, channels, band_pixels=band), expected)


def tiny_onnx(path: Path, image_size: int = 8, classes: int = 2) -> Path:
    """A real 2-node ONNX classifier (flatten, matmul): enough for a real Predictor."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((image_size * image_size, classes), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, image_size, image_size, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, classes])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_one_server_process_decodes_at_most_the_configured_images_at_once(monkeypatch, tmp_path):
    """Eight threads (eight concurrent requests) decode through one Predictor built as the
    server builds it (serving.json's limits): never more than max_concurrent_decodes at a
    time. The decode is held open until the test has seen who got in (events, no clock)."""
    import threading

    from tfmlops.serving import predictor as module

    config = {"runtime": "onnx", "classes": ["a", "b"], "image_size": 8, "channels": 1,
              "mean": [0.0], "std": [1.0], "limits": {"max_concurrent_decodes": 2}}
    (tmp_path / "serving.json").write_text(json.dumps(config))
    predictor = module.Predictor.from_files(tiny_onnx(tmp_path / "model.onnx"),
                                            tmp_path / "serving.json")
    inside, most, guard = 0, 0, threading.Lock()
    entered, release = threading.Semaphore(0), threading.Event()

    def held_decode(*args, **kwargs):
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        entered.release()
        release.wait(60)
        with guard:
            inside -= 1
        return np.zeros((8, 8, 1), np.float32)

    monkeypatch.setattr(module, "image_input", held_decode)  # the decode itself, observed
    threads = [threading.Thread(target=predictor.image_input, args=(b"x",)) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        assert entered.acquire(timeout=60) and entered.acquire(timeout=60)  # two got in
        assert not entered.acquire(timeout=1.0), "a third decode ran beside two"
    finally:
        release.set()
        for t in threads:
            t.join(timeout=60)
    assert most == 2
    probs = predictor.probabilities(np.ones((1, 8, 8, 1), np.float32))  # the model is real
    np.testing.assert_allclose(probs, [[64.0, 64.0]])


@pytest.mark.parametrize("fmt, name", [("TIFF", "TIFF"), ("WEBP", "WEBP"), ("ICO", "ICO"),
                                       ("PPM", None), ("TGA", None)])
def test_only_the_supported_pillow_plugins_read_the_bytes(fmt, name, monkeypatch):
    """Image.open gets the supported formats alone: another format's bytes never reach its
    plugin (the file is refused as unsupported or as not an image), in prepare and serving."""
    from tfmlops.data.decode import ImageRejected, open_image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(buf, fmt)
    data = buf.getvalue()
    assert Image.open(io.BytesIO(data)).format == fmt  # Pillow itself would open it
    factory, accept = Image.OPEN[fmt]
    reached = []
    monkeypatch.setitem(Image.OPEN, fmt, (lambda *a: reached.append(fmt) or factory(*a), accept))
    with pytest.raises(ImageRejected) as caught:
        open_image(data)
    assert reached == []
    assert str(caught.value) == (f"unsupported image format {name}; use PNG or JPEG" if name
                                 else "not an image")


def _encoded(fmt: str, width: int, height: int) -> bytes:
    buf = io.BytesIO()
    photo(width, height, seed=width).save(buf, fmt)
    return buf.getvalue()


def test_the_savedmodels_bytes_signature_refuses_headers_beyond_the_cap(tmp_path):
    """Through tf.saved_model.load, as TensorFlow Serving loads it: an image whose header
    claims more than export.serving.max_image_pixels is refused before it is decoded, in
    every format the signature reads (PNG, JPEG, BMP); images within the cap are answered."""
    import keras
    import tensorflow as tf

    from tfmlops.stages.export.signatures import export_saved_model

    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(
        keras.layers.Flatten()(inputs)))
    cap = 64 * 48
    export_saved_model(model, tmp_path / "sm", ["a", "b"], 8, 3, MEAN, STD, max_pixels=cap)
    serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    for fmt in ("PNG", "JPEG", "BMP"):
        ok = serve(image_bytes=tf.constant([_encoded(fmt, 64, 48)]))
        assert ok["probabilities"].shape == (1, 2), fmt
        for big in (_encoded(fmt, 65, 48), _encoded(fmt, 48, 65)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"more than 3072 pixels \(export.serving.max_image_pixels\)"):
                serve(image_bytes=tf.constant([_encoded(fmt, 64, 48), big]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="export.serving.max_image_pixels"):
        serve(image_bytes=tf.constant([png_header(30000, 30000)]))  # a 60-byte bomb
    top_down = bytearray(_encoded("BMP", 80, 60))
    top_down[22:26] = (-60).to_bytes(4, "little", signed=True)  # rows stored top-down
    with pytest.raises(tf.errors.InvalidArgumentError, match="export.serving.max_image_pixels"):
        serve(image_bytes=tf.constant([bytes(top_down)]))


def _gif_bomb(side: int = 4096) -> bytes:
    """A palette GIF of one side x side frame whose logical screen (bytes 6-9) says 1x1."""
    buf = io.BytesIO()
    Image.new("P", (side, side), 0).save(buf, "GIF")
    data = bytearray(buf.getvalue())
    data[6:10] = (1).to_bytes(2, "little") * 2
    return bytes(data)


def test_the_savedmodel_refuses_gif_and_formats_it_cannot_bound(tmp_path):
    """TensorFlow sizes a decoded GIF by its largest frame, not by the screen its header
    states: a 13 KB GIF with a 1x1 screen decoded to 4096x4096 (+1 GB) under a 1,024-pixel
    cap. Every GIF, and WebP (decode_image reads it; no header check here bounds it), is
    refused in one line before decoding; the Pillow path (`tfmlops serve`) still takes a
    well-formed GIF and refuses the crafted one by its frame size."""
    import keras
    import tensorflow as tf

    from tfmlops.data.decode import ImageRejected
    from tfmlops.stages.export.signatures import export_saved_model

    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(
        keras.layers.Flatten()(inputs)))
    export_saved_model(model, tmp_path / "sm", ["a", "b"], 8, 1, MEAN[:1], STD[:1],
                       max_pixels=1024)
    serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    small_png, small_gif, webp = (_encoded(fmt, 32, 32) for fmt in ("PNG", "GIF", "WEBP"))
    assert serve(image_bytes=tf.constant([small_png]))["probabilities"].shape == (1, 2)
    bomb = _gif_bomb()
    for refused, words in ((bomb, "GIF is not read by this signature"),
                           (small_gif, "GIF is not read by this signature"),
                           (webp, "not PNG, JPEG or BMP")):
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            serve(image_bytes=tf.constant([small_png, refused]))
        assert f"image refused: {words}" in caught.value.message
    assert image_input(small_gif, 1, 8, MEAN[:1], STD[:1], max_pixels=1024).shape == (8, 8, 1)
    with pytest.raises(ImageRejected, match="image of 4096x4096 pixels is too large"):
        load_pixels(bomb, 1, max_pixels=1024)
