"""Stage `materialize`: write the built-in dataset as class-per-folder PNGs.

The built-in data goes through exactly the path a user's own images take:
`prepare` reads a folder. Point `data.image_dir` elsewhere to use your own.
"""

from __future__ import annotations

from tfmlops.config import Config
from tfmlops.data.builtin import materialize


def run(cfg: Config) -> dict[str, int]:
    counts = materialize(cfg)
    print(f"materialize: {counts['images']} {cfg.data.builtin} images in {counts['classes']} "
          f"classes -> {cfg.paths.builtin}")
    return counts
