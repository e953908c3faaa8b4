"""`mlflow models serve -m models:/<name>@production` on 127.0.0.1, with real test images.

One server for the module, started the way the README says, with pickle
deserialization disabled: it must load the models-from-code pyfunc without it.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import requests

from conftest import child_env

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(exported_digits, tmp_path_factory):
    from tfmlops.serving import local_server
    from tfmlops.stages import promote
    from tfmlops.tracking import tracking_uri

    cfg = exported_digits
    promote.run(cfg)  # the exported version -> @production (this store's gate floor is 0.5)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, url = local_server.start(f"models:/{cfg.promote.registered_model}@production",
                                   tracking_uri(cfg), log, env=child_env(), cwd=log.parent)
    try:
        local_server.wait_ready(proc, url, log, timeout_s=180)
        yield url
    finally:
        local_server.stop(proc)


def invoke(url: str, payload) -> requests.Response:
    return requests.post(f"{url}/invocations", json=payload, timeout=30)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png_header(width: int, height: int) -> bytes:
    """A PNG header claiming width x height pixels, with none: a decompression bomb's."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_real_test_images_as_base64_match_the_offline_model(server, exported_digits,
                                                            exported_offline):
    off = exported_offline
    rows = [{"image": b64(off["encoded"][i])} for i in range(6)]
    answer = invoke(server, {"dataframe_records": rows})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    probs = np.array([p["probabilities"] for p in predictions])
    np.testing.assert_allclose(probs, off["probs"][:6], atol=exported_digits.export.atol)
    classes = off["prepared"].classes
    assert [p["label"] for p in predictions] == [classes[i] for i in off["probs"][:6].argmax(1)]
    assert [p["label_index"] for p in predictions] == list(off["probs"][:6].argmax(1))


def test_a_colour_jpeg_of_another_size_matches_the_savedmodel(server, exported_digits,
                                                              exported_offline):
    """The served NumPy path and the SavedModel's in-graph path agree on a new image."""
    import tensorflow as tf
    from PIL import Image

    cfg = exported_digits
    digit = Image.open(io.BytesIO(exported_offline["encoded"][3])).convert("RGB")
    buf = io.BytesIO()
    digit.resize((41, 33)).save(buf, format="JPEG", quality=90)
    answer = invoke(server, {"dataframe_split": {"columns": ["image"],
                                                 "data": [[b64(buf.getvalue())]]}})
    assert answer.status_code == 200, answer.text
    served = answer.json()["predictions"][0]
    saved = tf.saved_model.load(f"{cfg.paths.export}/saved_model/{cfg.export.model_name}/1")
    offline = saved.signatures["serving_default"](image_bytes=tf.constant([buf.getvalue()]))
    np.testing.assert_allclose(served["probabilities"], offline["probabilities"].numpy()[0],
                               atol=cfg.export.atol)
    assert served["label"] == offline["label"].numpy()[0].decode()


def test_a_phones_mpo_is_accepted_as_its_first_picture(server, exported_offline):
    from PIL import Image

    digit = Image.open(io.BytesIO(exported_offline["encoded"][5])).convert("RGB")
    mpo, first = io.BytesIO(), io.BytesIO()
    digit.save(mpo, "MPO", save_all=True, append_images=[digit.rotate(90)], quality=90)
    digit.save(first, "JPEG", quality=90)
    answers = [invoke(server, {"dataframe_records": [{"image": b64(b.getvalue())}]})
               for b in (mpo, first)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert answers[0].json() == answers[1].json()


def test_a_float_array_matches_the_offline_model(server, exported_digits, exported_offline):
    off = exported_offline
    answer = invoke(server, {"dataframe_records": [{"pixels": off["x"][i].ravel().tolist()}
                                                   for i in (7, 8)]})
    assert answer.status_code == 200, answer.text
    probs = np.array([p["probabilities"] for p in answer.json()["predictions"]])
    np.testing.assert_allclose(probs, off["probs"][7:9], atol=exported_digits.export.atol)


@pytest.mark.parametrize("payload, words", [
    ({"dataframe_records": [{"image": b64(b"hello, not an image")}]}, "is not an image"),
    ({"dataframe_records": [{"image": "%%% not base64 %%%"}]}, "not valid base64"),
    ({"dataframe_records": [{"pixels": [0.5] * 17}]}, "holds 17 values (shape 17); the model "
                                                      "takes 256 = 16x16x1"),
    ({"dataframe_records": [{"other": 1}]}, "no rows"),
    ({"dataframe_records": [{"image": b64(png_header(30_000, 30_000))}]}, "decompression bomb"),
    (b"", "valid JSON"),
    (b"{not json", "valid JSON"),
])
def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, exported_offline,
                                                                   payload, words):
    if isinstance(payload, bytes):
        answer = requests.post(f"{server}/invocations", data=payload, timeout=30,
                               headers={"Content-Type": "application/json"})
    else:
        answer = invoke(server, payload)
    assert 400 <= answer.status_code < 500, answer.text
    assert words in answer.json()["message"]
    if words == "decompression bomb":  # refused on its header: the reason, no traceback
        assert "Traceback" not in answer.text and "stack_trace" not in answer.json()
    good = invoke(server, {"dataframe_records": [{"image": b64(exported_offline["encoded"][0])}]})
    assert good.status_code == 200
