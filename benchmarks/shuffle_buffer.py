"""Row 6's synthetic shapes at one size, trained with a given shuffle buffer.

Why it exists: at 16x, row 6 scored 0.74 with the default buffer (2,048 records)
while prepare wrote the train split's 13,440 records class by class; a buffer
above the split's count scored 1.0, and so does the default buffer since prepare
writes in content-hash order (see BENCHMARKS.md, row 6).

    .venv/bin/python benchmarks/shuffle_buffer.py [--factor 16] [--buffer 2048] [--epochs 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training import synthetic_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=16)
    parser.add_argument("--buffer", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    from tfmlops.config import SyntheticConfig
    from tfmlops.stages import materialize, prepare, train

    images = SyntheticConfig().count * args.factor
    cfg = synthetic_config(images, args.epochs, pipeline={"shuffle_buffer": args.buffer})
    materialize.run(cfg)
    prepare.run(cfg)
    started = time.perf_counter()
    metrics = train.run(cfg)
    print(f"{images} images, shuffle_buffer {args.buffer}: test accuracy "
          f"{metrics['test_accuracy']:.4f} ({time.perf_counter() - started:.0f} s of train)")


if __name__ == "__main__":  # spawned prepare workers import this file
    main()
