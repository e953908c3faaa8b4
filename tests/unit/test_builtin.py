"""The built-in datasets: real digits as PNG folders, synthetic RGB shapes from the seed."""

import hashlib

import numpy as np
from PIL import Image

from tfmlops.stages import materialize
from tfmlops.stages.materialize.builtin import SHAPES, write_digits, write_shapes


def folder_digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.png")):
        h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_digits_are_the_real_sklearn_digits(tmp_path):
    from sklearn.datasets import load_digits

    counts = write_digits(tmp_path / "d")
    assert sum(counts.values()) == 1797 and sorted(counts) == [str(i) for i in range(10)]
    img = np.asarray(Image.open(tmp_path / "d" / "0" / "digit_0000.png"))
    expected = np.clip(load_digits().images[0] * 255 / 16, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(img, expected)


def test_digits_are_read_without_importing_sklearn():
    """load_digits reads scikit-learn's own file as scikit-learn does (the same arrays) in a
    process that never imports scikit-learn (its import was most of materialize's time)."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sklearn_digits

    from tfmlops.stages.materialize.builtin import load_digits

    images, labels = load_digits()
    expected = sklearn_digits()
    np.testing.assert_array_equal(images, expected.images)
    np.testing.assert_array_equal(labels, expected.target)
    assert images.dtype == expected.images.dtype and labels.dtype == expected.target.dtype
    code = ("import sys; from tfmlops.stages.materialize.builtin import load_digits; "
            "load_digits(); print(sorted(m for m in ('sklearn', 'scipy', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_shapes_are_rgb_deterministic_from_the_seed_and_scale(tmp_path):
    counts = write_shapes(tmp_path / "a", count=40, size=24, classes=4, seed=1)
    assert counts == {s: 10 for s in SHAPES[:4]}
    img = Image.open(next((tmp_path / "a" / "circle").glob("*.png")))
    assert img.mode == "RGB" and img.size == (24, 24)
    write_shapes(tmp_path / "b", count=40, size=24, classes=4, seed=1)
    write_shapes(tmp_path / "c", count=40, size=24, classes=4, seed=2)
    assert folder_digest(tmp_path / "a") == folder_digest(tmp_path / "b")
    assert folder_digest(tmp_path / "a") != folder_digest(tmp_path / "c")
    assert sum(write_shapes(tmp_path / "x4", 160, 24, 4, seed=1).values()) == 4 * 40


def test_classes_differ_visibly(tmp_path):
    """A nearest-class-mean classifier beats chance: the labels carry signal."""
    write_shapes(tmp_path / "s", count=400, size=16, classes=4, seed=3)
    xs, ys = [], []
    for label, shape in enumerate(SHAPES[:4]):
        for p in sorted((tmp_path / "s" / shape).glob("*.png")):
            xs.append(np.asarray(Image.open(p).convert("L"), np.float32).ravel() / 255)
            ys.append(label)
    x, y = np.stack(xs), np.asarray(ys)
    train, test = np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1
    means = np.stack([x[train & (y == k)].mean(0) for k in range(4)])
    pred = np.argmin(((x[test][:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y[test]).mean() > 0.4  # chance is 0.25


def test_materialize_replaces_the_folder_whole(make_cfg):
    cfg = make_cfg(data={"builtin": "synthetic", "synthetic": {"count": 24, "image_size": 16,
                                                               "classes": 3}})
    assert materialize.run(cfg) == {"images": 24, "classes": 3}
    cfg2 = make_cfg(data={"builtin": "synthetic", "synthetic": {"count": 20, "image_size": 16,
                                                                "classes": 2}})
    assert materialize.run(cfg2) == {"images": 20, "classes": 2}
    from pathlib import Path

    assert sorted(p.name for p in Path(cfg2.paths.builtin).iterdir()) == ["circle", "square"]
