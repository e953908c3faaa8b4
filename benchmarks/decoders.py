"""How far the JPEG decoders of the stack are apart on prepare's stored JPEGs.

Each photo goes through prepare's own path (`store.store_bytes`), then its stored JPEG
is decoded by TensorFlow's default (`decode_image`), TensorFlow with the accurate
integer DCT (what training, evaluation and the SavedModel use), Pillow (the served
model) and OpenCV (prepare's statistics); prints the largest difference of each
from the accurate TensorFlow decoding, in grey levels.

    python benchmarks/decoders.py /tmp/photos4k --images 40 --size 96
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from tfmlops.data.store import StoreSpec, store_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", type=Path)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--size", type=int, default=96)
    args = parser.parse_args()
    import tensorflow as tf

    spec = StoreSpec(3, args.size, "jpeg", 90, args.size)
    files = sorted(args.photos.glob("*/*.jpg"))[:args.images]
    worst = {"tensorflow_default": 0, "pillow": 0, "opencv": 0}
    for f in files:
        data = store_bytes(f.read_bytes(), spec).data
        accurate = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        others = {
            "tensorflow_default": tf.io.decode_image(data, channels=3).numpy(),
            "pillow": np.asarray(Image.open(io.BytesIO(data)).convert("RGB")),
            "opencv": cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB),
        }
        for name, pixels in others.items():
            diff = np.abs(pixels.astype(np.int16) - accurate.astype(np.int16)).max()
            worst[name] = max(worst[name], int(diff))
    print(json.dumps({"images": len(files), "max_grey_levels_from_accurate_dct": worst}))


if __name__ == "__main__":
    main()
