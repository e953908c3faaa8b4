"""Stage `materialize`: write the built-in dataset as class-per-folder PNGs.

The built-in data goes through exactly the path a user's own images take:
`prepare` reads a folder. Point `data.image_dir` elsewhere to use your own.
"""

from __future__ import annotations

import logging

from tfmlops.config import Config
from tfmlops.data.builtin import materialize

log = logging.getLogger(__name__)


def run(cfg: Config) -> dict[str, int]:
    counts = materialize(cfg)
    log.info("materialize: %d %s images in %d classes -> %s", counts["images"], cfg.data.builtin,
             counts["classes"], cfg.paths.builtin)
    return counts
