"""Row 1's floor (issue 12): CPU per photo of decoding alone, of the PIL loop row 1
compares against, and of a prepare worker's whole job, on the same photos in one
process (`time.process_time`, nothing else timed).

- decode: open and decode with draft at the smallest scale that keeps 96 px (what
  any prepare must do at least; PNG has no draft and is decoded in full);
- loop: open, convert to RGB, resize to 96x96 (row 1's single-process loop);
- worker: `data.store.hash_and_store` (read, hash, decode, resize, encode, statistics).

    .venv/bin/python benchmarks/decode_floor.py [--set-dir /tmp/tfmlops-photos] [--images 600]
"""

from __future__ import annotations

import argparse
import io
import random
import time
from pathlib import Path

SIZE = 96


def per_image_ms(fn, items) -> float:
    started = time.process_time()
    for item in items:
        fn(item)
    return round(1000 * (time.process_time() - started) / len(items), 2)


def main() -> None:
    from PIL import Image

    from tfmlops.data.store import StoreSpec, hash_and_store, setup_worker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set-dir", type=Path, default=Path("/tmp/tfmlops-photos"))
    parser.add_argument("--images", type=int, default=600)
    args = parser.parse_args()
    files = sorted(p for p in args.set_dir.rglob("*") if p.suffix in (".jpg", ".png"))
    random.Random(1).shuffle(files)
    files = files[: args.images]
    data = [f.read_bytes() for f in files]  # held in memory: no disk in the figures

    def decode(blob: bytes) -> None:
        with Image.open(io.BytesIO(blob)) as img:
            if img.format == "JPEG":
                img.draft("RGB", (SIZE, SIZE))
            img.load()

    def loop(blob: bytes) -> None:
        with Image.open(io.BytesIO(blob)) as img:
            img.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)

    spec = StoreSpec(channels=3, short_side=SIZE, encoding="auto", jpeg_quality=90, image_size=SIZE)
    empty = __import__("numpy").zeros(0, "uint64")
    setup_worker(empty)  # as a pool worker starts: one thread for OpenCV and BLAS
    jpegs = [b for b, f in zip(data, files, strict=True) if f.suffix == ".jpg"]
    pngs = [b for b, f in zip(data, files, strict=True) if f.suffix == ".png"]
    for _ in range(2):  # twice: the second pass is warm
        print(f"{len(files)} photos, CPU ms per photo: decode {per_image_ms(decode, data)} "
              f"(JPEG {per_image_ms(decode, jpegs)}, PNG {per_image_ms(decode, pngs)}), "
              f"loop {per_image_ms(loop, data)}, "
              f"worker {per_image_ms(lambda f: hash_and_store(str(f), spec, empty), files)}")


if __name__ == "__main__":
    main()
