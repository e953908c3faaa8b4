"""`tfmlops serve -m models:/<name>@production` on 127.0.0.1, with real test images.

One server for the module, started the way the README says, with pickle
deserialization disabled: it must load the models-from-code pyfunc without it.
`tfmlops serve` is MLflow's scoring app behind the project's request checks: every
content type MLflow's server accepts is sent to it here.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import child_env
from images import png_header
from tfmlops.artifacts import REGISTERED, SERVING

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(exported_digits, tmp_path_factory):
    import local_server
    from tfmlops.stages import promote
    from tfmlops.tracking import tracking_uri

    cfg = exported_digits
    # A person's `--version N` (the exported version; this store's gate floor is 0.5): plain
    # promote would follow the policy of whatever git checkout the suite runs from.
    version = int(json.loads((Path(cfg.paths.export) / REGISTERED).read_text())["version"])
    assert promote.run(cfg, version=version)["outcome"] == "promoted"
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


def colour_jpeg(exported_offline, size) -> bytes:
    from PIL import Image

    digit = Image.open(io.BytesIO(exported_offline["encoded"][3])).convert("RGB")
    buf = io.BytesIO()
    digit.resize(size).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def test_a_colour_jpeg_at_the_stored_size_matches_the_savedmodel(server, exported_digits,
                                                                 exported_offline):
    """The served NumPy path and the SavedModel's in-graph path agree on a new image whose
    short side is the stored size (nothing to reduce: the same pixels)."""
    import tensorflow as tf

    cfg = exported_digits
    data = colour_jpeg(exported_offline, (16, 21))
    answer = invoke(server, {"dataframe_split": {"columns": ["image"], "data": [[b64(data)]]}})
    assert answer.status_code == 200, answer.text
    served = answer.json()["predictions"][0]
    saved = tf.saved_model.load(f"{cfg.paths.export}/saved_model/{cfg.export.model_name}/1")
    offline = saved.signatures["serving_default"](image_bytes=tf.constant([data]))
    np.testing.assert_allclose(served["probabilities"], offline["probabilities"].numpy()[0],
                               atol=cfg.export.atol)
    assert served["label"] == offline["label"].numpy()[0].decode()


def test_a_colour_jpeg_of_another_size_is_served_as_the_savedmodel_would(
        server, exported_digits, exported_offline):
    """Reduced to the stored short side, the two paths differ by OpenCV's fixed-point
    bilinear against TensorFlow's: at most one grey level (serving.signatures). What that
    grey level does to the probabilities depends on the model, so the two halves are
    checked apart: the pixels within one grey level, and the served model equal to the
    SavedModel on the served path's own input."""
    import tensorflow as tf

    from tfmlops.serving.preprocess import image_input
    from tfmlops.stages.export.signatures import FLOAT_SIGNATURE
    from tfmlops.stages.export.skew import graph_decoding_difference

    cfg = exported_digits
    data = colour_jpeg(exported_offline, (41, 33))
    config = json.loads((Path(cfg.paths.export) / SERVING).read_text())
    grey = graph_decoding_difference({"channels": config["channels"],
                                      "stored": {"short_side": config["stored_size"]}}, [data])
    assert grey <= 1
    answer = invoke(server, {"dataframe_split": {"columns": ["image"], "data": [[b64(data)]]}})
    assert answer.status_code == 200, answer.text
    served = answer.json()["predictions"][0]
    x = image_input(data, config["channels"], config["image_size"], config["mean"],
                    config["std"], config["stored_size"])
    saved = tf.saved_model.load(f"{cfg.paths.export}/saved_model/{cfg.export.model_name}/1")
    offline = saved.signatures[FLOAT_SIGNATURE](image=tf.constant(x[None]))
    np.testing.assert_allclose(served["probabilities"], offline["probabilities"].numpy()[0],
                               atol=cfg.export.atol)


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


def _png(width: int, height: int, cut: float = 1.0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    noise = np.random.default_rng(width).integers(0, 256, (height, width), dtype=np.uint8)
    Image.fromarray(noise).save(buf, format="PNG")
    return buf.getvalue()[: int(len(buf.getvalue()) * cut)]


def _jpeg(cut: float) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()[: int(len(buf.getvalue()) * cut)]


def _tiff() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8), 3).save(buf, format="TIFF")
    return buf.getvalue()


# One kind of bad row each: (payload, words its one-line reason holds). Every one is a
# 400 with the project's own reason alone: no stack trace, no echo of the request.
BAD_ROWS = [
    ({"dataframe_records": [{"image": b64(b"hello, not an image")}]}, "is not an image"),
    ({"dataframe_records": [{"image": "%%% not base64 %%%"}]}, "not valid base64"),
    ({"dataframe_records": [{"image": ""}]}, "must be a non-empty base64 string"),
    ({"dataframe_records": [{"pixels": [0.5] * 17}]}, "holds 17 values (shape 17); the model "
                                                      "takes 256 = 16x16x1"),
    ({"dataframe_records": [{"pixels": [0.5] * 256, "image": b64(b"x")}]},
     "has both 'image' and 'pixels'"),
    # raw 0-255 values where normalized floats go (MLflow: "Can not safely convert int64")
    ({"dataframe_records": [{"pixels": [i % 256 for i in range(256)]}]},
     "'pixels' holds integers (int64); the model takes normalized floats"),
    ({"dataframe_records": [{"other": 1}]}, "no rows"),  # MLflow drops unknown columns
    ({"dataframe_records": [{"image": b64(png_header(30_000, 30_000))}]}, "decompression bomb"),
    ({"dataframe_records": [{"image": b64(png_header(10_000, 10_000))}]}, "decompression bomb"),
    ({"dataframe_records": [{"image": b64(_png(40, 40, cut=0.5))}]}, "corrupt or truncated"),
    ({"dataframe_records": [{"image": b64(_jpeg(cut=0.3))}]}, "corrupt or truncated"),
    ({"dataframe_records": [{"image": b64(png_header(64, 64))}]}, "corrupt or truncated"),
    ({"dataframe_records": [{"image": b64(_tiff())}]}, "unsupported image format TIFF"),
    # the caps (export.serving defaults), refused on the headers before any decoding
    ({"dataframe_records": [{"image": b64(png_header(4097, 4096))}]},
     "(export.serving.max_image_pixels)"),
    ({"dataframe_records": [{"image": b64(png_header(4096, 4096))}] * 5},
     "(export.serving.max_request_pixels)"),
    ({"dataframe_records": [{"image": "x"}] * 1025}, "send at most 1024 (export.serving.max_rows)"),
]


@pytest.mark.parametrize("payload, words", BAD_ROWS)
def test_every_bad_row_gets_a_one_line_400_without_a_trace(server, exported_offline,
                                                           payload, words):
    answer = invoke(server, payload)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert words in body["message"], body["message"]
    assert "\n" not in body["message"] and "Failed to predict" not in body["message"]
    assert "stack_trace" not in body and "Traceback" not in answer.text
    good = invoke(server, {"dataframe_records": [{"image": b64(exported_offline["encoded"][0])}]})
    assert good.status_code == 200


@pytest.mark.parametrize("payload", [b"", b"{not json"])
def test_a_body_that_is_not_json_gets_a_4xx_and_the_server_keeps_serving(server,
                                                                         exported_offline,
                                                                         payload):
    """MLflow's own parsing answers these, before any row reaches the model."""
    answer = requests.post(f"{server}/invocations", data=payload, timeout=30,
                           headers={"Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.text
    assert "valid JSON" in answer.json()["message"]
    assert "stack_trace" not in answer.json() and "\n" not in answer.json()["message"]
    good = invoke(server, {"dataframe_records": [{"image": b64(exported_offline["encoded"][0])}]})
    assert good.status_code == 200


def test_the_request_caps_come_from_serving_json(exported_digits, tmp_path):
    """export wrote export.serving into serving.json; the Predictor enforces what it reads."""
    import json

    from tfmlops.serving.predictor import Predictor
    from tfmlops.serving.preprocess import RequestError

    out = Path(exported_digits.paths.export)
    config = json.loads((out / SERVING).read_text())
    assert config["limits"] == {"max_rows": 1024, "max_image_pixels": 4096 * 4096,
                                "max_request_pixels": 64 * 2**20,
        "max_request_decoded_bytes": 256 * 2**20, "max_body_bytes": 16 * 2**20,
        "max_concurrent_decodes": 2, "max_concurrent_requests": 16, "body_timeout_s": 30.0,
        "max_json_values": 2**19}
    config["limits"] = {"max_rows": 3, "max_image_pixels": 30 * 30, "max_request_pixels": 2000}
    (tmp_path / SERVING).write_text(json.dumps(config))
    predictor = Predictor.from_files(out / config["file"], tmp_path / SERVING)
    ok = {"image": b64(_png(30, 30))}
    assert predictor.inputs([ok, ok]).shape == (2, 16, 16, 1)
    cases = [([ok] * 4, "4 rows in one request; send at most 3 (export.serving.max_rows)"),
             ([ok, {"image": b64(_png(31, 30))}],
              "row 1: 'image' of 31x30 = 930 pixels is too large; send at most 900 pixels per "
              "image (export.serving.max_image_pixels)"),
             ([ok, ok, ok], "the request's images claim 2,700 pixels in all; send at most 2,000 "
                            "per request (export.serving.max_request_pixels)")]
    for rows, message in cases:
        with pytest.raises(RequestError) as caught:
            predictor.inputs(rows)
        assert str(caught.value).startswith(message), str(caught.value)


# ------------------------------------------------------------ tfmlops serve's own checks

def one_line(answer: requests.Response, status: int) -> str:
    """The one-line message of an error answer: JSON {error_code, message}, no trace."""
    assert answer.status_code == status, (answer.status_code, answer.text)
    body = answer.json()
    assert set(body) == {"error_code", "message"}, body
    assert "\n" not in body["message"] and "Traceback" not in answer.text
    return body["message"]


def post(url: str, data, content_type: str | None) -> requests.Response:
    headers = {"Content-Type": content_type} if content_type else {}
    return requests.post(f"{url}/invocations", data=data, headers=headers, timeout=60)


@pytest.mark.parametrize("kind, body", [
    ("text/csv", "image\n{image}\n"),  # MLflow's CSV parser refuses this model's schema
    ("text/csv", 'image\n"never closed\n'),
    ("text/csv", b"image\n\xff\xfe not utf-8\n"),
    ("application/vnd.apache.parquet", "parquet"),  # a real Parquet file of one image row
    ("application/vnd.apache.parquet", b"PAR1 garbage"),
    ("text/plain", "image\n{image}\n"), (None, "{{}}"), ("application/xml", "<xml/>"),
])
def test_every_content_type_but_json_gets_a_one_line_415(server, exported_offline, kind, body):
    """MLflow's server reads JSON, CSV and Parquet; the served model documents JSON only.
    Whatever the body, the answer is one line, and no parser sees it."""
    import pandas as pd

    image = b64(exported_offline["encoded"][0])
    if body == "parquet":
        buf = io.BytesIO()
        pd.DataFrame({"image": [image]}).to_parquet(buf)
        body = buf.getvalue()
    elif isinstance(body, str):
        body = body.format(image=image)
    message = one_line(post(server, body, kind), 415)
    assert message.startswith(f"content type {kind or '(none)'!r} is not accepted; send "
                              "application/json"), message


def test_json_with_another_charset_gets_mlflows_415_in_one_line(server):
    latin = post(server, b'{"dataframe_records": []}', "application/json; charset=latin-1")
    assert "UTF-8" in one_line(latin, 415)


@pytest.mark.parametrize("body", [b'{"dataframe_records": [{"image": ', b'{"columns": 1}',
                                  b'{"dataframe_split": {"columns": ["image"], "data": 7}}'])
def test_malformed_json_gets_a_one_line_400(server, body):
    assert one_line(post(server, body, "application/json"), 400)


def test_a_body_over_the_cap_gets_a_one_line_413_before_it_is_read(server, exported_offline):
    """export.serving.max_body_bytes (16 MiB by default), from the Content-Length or, for a
    chunked body, while it streams in; the server keeps serving."""
    cap = 16 * 2**20
    chunk = b"x" * 2**20

    def chunks():
        for _ in range(cap // len(chunk) + 1):
            yield chunk

    for data in (chunk * (cap // len(chunk) + 1), chunks()):
        message = one_line(post(server, data, "application/json"), 413)
        assert "larger than 16,777,216 bytes (export.serving.max_body_bytes)" in message
    good = invoke(server, {"dataframe_records": [{"image": b64(exported_offline["encoded"][0])}]})
    assert good.status_code == 200


def test_serve_answers_8_keep_alive_clients_and_bounds_stalled_and_surplus_uploads(
        server, exported_digits, exported_offline, tmp_path):
    """`tfmlops serve`'s own wiring of export.serving's request limits, from the model's
    serving.json (this copy of the registered model sets body_timeout_s to 2 s; the rest are
    the defaults): 8 concurrent keep-alive clients are all answered 200; with all 16 slots
    (max_concurrent_requests) held by stalled uploads, one more request gets a one-line 503;
    each stalled upload gets a one-line 408 once its body is 2 s late; then it serves again."""
    import threading
    import time

    import local_server
    from tfmlops.tracking import import_mlflow, tracking_uri

    cfg = exported_digits
    folder = Path(import_mlflow().artifacts.download_artifacts(
        f"models:/{cfg.promote.registered_model}@production", dst_path=str(tmp_path / "model"),
        tracking_uri=tracking_uri(cfg)))
    config_file = folder / "artifacts" / SERVING
    config = json.loads(config_file.read_text())
    config["limits"]["body_timeout_s"] = 2.0
    config_file.write_text(json.dumps(config))
    log = tmp_path / "serve.log"
    proc, url = local_server.start(str(folder), tracking_uri(cfg), log, env=child_env(),
                                   cwd=tmp_path)
    row = {"dataframe_records": [{"image": b64(exported_offline["encoded"][0])}]}
    try:
        local_server.wait_ready(proc, url, log, timeout_s=180)
        codes: list[int] = []

        def client():
            with requests.Session() as session:  # one keep-alive connection
                codes.extend(session.post(f"{url}/invocations", json=row, timeout=60).status_code
                             for _ in range(10))

        clients = [threading.Thread(target=client) for _ in range(8)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        assert codes == [200] * 80, codes
        port = int(url.rsplit(":", 1)[1])
        started = time.monotonic()
        stalled = [local_server.raw_post(port, ["Content-Type: application/json",
                                                "Content-Length: 1000"], b'{"dataframe_')
                   for _ in range(16)]
        while (busy := invoke(url, row)).status_code == 200 and time.monotonic() < started + 2:
            time.sleep(0.05)  # until the 16 stalled uploads hold every slot
        assert "(export.serving.max_concurrent_requests)" in one_line(busy, 503)
        for sock in stalled:
            with sock:
                status, body = local_server.raw_answer(sock)
            assert status == 408 and "within 2 s (export.serving.body_timeout_s)" in \
                body["message"], (status, body)
        assert time.monotonic() - started < 2 + 5
        assert invoke(url, row).status_code == 200
    finally:
        local_server.stop(proc)


# ------------------------------------------------ the lean path against MLflow's own

def good_bodies(exported_offline) -> dict[str, dict]:
    """One body of each shape the lean path takes, and of each it leaves to MLflow."""
    off = exported_offline
    images = [b64(off["encoded"][i]) for i in range(3)]
    pixels = [off["x"][i].ravel().tolist() for i in range(2)]
    return {
        "records_image": {"dataframe_records": [{"image": images[0]}]},
        "records_images": {"dataframe_records": [{"image": i} for i in images]},
        "records_pixels": {"dataframe_records": [{"pixels": p} for p in pixels]},
        "split_image": {"dataframe_split": {"columns": ["image"], "data": [[i] for i in images]}},
        "split_pixels": {"dataframe_split": {"columns": ["pixels"], "data": [[pixels[0]]]}},
        # MLflow's path: these shapes are not the lean path's
        "split_with_index": {"dataframe_split": {"index": [4], "columns": ["image"],
                                                 "data": [[images[1]]]}},
        "instances": {"instances": {"image": images[2]}},
        "inputs": {"inputs": {"image": images[0]}},
    }


LEAN_SHAPES = ["records_image", "records_images", "records_pixels", "split_image", "split_pixels"]


def via_mlflows_path(payload: dict) -> dict:
    """The same request, sent down MLflow's own path in `tfmlops serve`: a `params` key is a
    shape the lean path leaves to MLflow, and this model ignores params."""
    return {**payload, "params": {}}


def test_the_lean_path_takes_the_documented_shapes_and_leaves_the_rest(exported_offline):
    from tfmlops.serving.lean import request_rows

    bodies = {k: json.dumps(v).encode() for k, v in good_bodies(exported_offline).items()}
    assert [k for k, body in bodies.items() if request_rows(body) is not None] == LEAN_SHAPES
    image, pixels = good_bodies(exported_offline)["records_image"], [0.5] * 256
    for other in ({**image, "params": {}}, {"dataframe_records": [{"image": "x", "other": 1}]},
                  {"dataframe_records": [{"image": "x"}, {"pixels": pixels}]},
                  {"dataframe_records": [{"pixels": [1] + pixels[1:]}]},
                  {"dataframe_records": [{"pixels": [[v] for v in pixels]}]},
                  {"dataframe_records": [{"image": None}]}, {"dataframe_records": []}, [image]):
        assert request_rows(json.dumps(other).encode()) is None, other
    assert request_rows(b"[" * 100_000 + b"]" * 100_000) is None  # deeper than Python recurses


def test_the_lean_path_answers_byte_for_byte_as_mlflows_path(server, exported_offline):
    """200 answers: the same bytes whichever path `tfmlops serve` takes, for every shape."""
    for name, payload in good_bodies(exported_offline).items():
        lean, mlflows = invoke(server, payload), invoke(server, via_mlflows_path(payload))
        assert lean.status_code == 200, (name, lean.text)
        assert lean.content == mlflows.content, name


@pytest.mark.parametrize("content_type, status", [
    ("application/json; charset=UTF-8", 200), ("application/json;charset=utf-8", 200),
    ("application/json; charset=latin-1", 415), ("Application/JSON", 415),
    ("application/json; v=2", 415), ("application/json;", 415),
    ("application/json ; charset = utf-8", 415)])
def test_a_good_body_under_any_json_content_type_gets_mlflows_answer(server, exported_offline,
                                                                    content_type, status):
    """MLflow's parser reads `application/json` with no parameter but charset=utf-8 (and
    answers 415 to the rest): the lean path takes a body only when MLflow would read it."""
    payload = good_bodies(exported_offline)["records_image"]
    lean = post(server, json.dumps(payload), content_type)
    mlflows = post(server, json.dumps(via_mlflows_path(payload)), content_type)
    assert (lean.status_code, lean.content) == (mlflows.status_code, mlflows.content)
    assert lean.status_code == status, lean.text


def test_a_body_nested_deeper_than_python_recurses_gets_a_one_line_answer(server):
    """Within max_json_values, yet json.loads raises RecursionError: MLflow's path answers
    it, in one line, and the server keeps serving."""
    nested = post(server, b"[" * 100_000 + b"]" * 100_000, "application/json")
    assert nested.status_code >= 400 and one_line(nested, nested.status_code)
    assert invoke(server, {"dataframe_records": [{"pixels": [0.5] * 256}]}).status_code == 200


@pytest.mark.parametrize("payload, words", BAD_ROWS)
def test_a_bad_row_gets_the_same_answer_from_both_paths(server, payload, words):
    lean, mlflows = invoke(server, payload), invoke(server, via_mlflows_path(payload))
    assert (lean.status_code, lean.content) == (mlflows.status_code, mlflows.content)


def test_serve_with_a_model_that_is_not_there_fails_in_one_line(tmp_path):
    import subprocess

    from conftest import VENV_BIN

    missing = tmp_path / "no-model"
    proc = subprocess.run([str(VENV_BIN / "tfmlops"), "serve", "-m", str(missing)],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"tfmlops serve: error: cannot fetch model {missing} (")


def test_mlflow_models_serve_as_the_readme_writes_it_answers_as_the_offline_model(
        server, exported_digits, exported_offline, tmp_path):
    """README: `mlflow models serve -m models:/<name>@production --env-manager local` (venv
    on PATH) serves the same model with the same API, without tfmlops' request checks."""
    import subprocess

    import local_server
    from conftest import VENV_BIN, free_port
    from tfmlops.tracking import tracking_uri

    cfg, off = exported_digits, exported_offline
    port, log = free_port(), tmp_path / "mlflow-serve.log"
    env = {**child_env(), "PATH": f"{VENV_BIN}:{child_env().get('PATH', '')}",
           "MLFLOW_TRACKING_URI": tracking_uri(cfg)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "mlflow"), "models", "serve", "-m",
             f"models:/{cfg.promote.registered_model}@production", "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        local_server.wait_ready(proc, url, log, timeout_s=180)
        rows = [{"image": b64(off["encoded"][i])} for i in range(4)]
        answer = invoke(url, {"dataframe_records": rows})
        assert answer.status_code == 200, answer.text
        probs = np.array([p["probabilities"] for p in answer.json()["predictions"]])
        np.testing.assert_allclose(probs, off["probs"][:4], atol=cfg.export.atol)
        # `tfmlops serve` (its lean path for most of these) answers with MLflow's very bytes
        for name, payload in good_bodies(off).items():
            assert invoke(server, payload).content == invoke(url, payload).content, name
    finally:
        local_server.stop(proc)
