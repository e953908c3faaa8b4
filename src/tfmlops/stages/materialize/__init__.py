"""Stage `materialize`: write the built-in dataset as class-per-folder PNGs.

The built-in data goes through exactly the path a user's own images take:
`prepare` reads a folder. Point `data.image_dir` elsewhere to use your own.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tfmlops import harness
from tfmlops.stage_spec import StageSpec

if TYPE_CHECKING:
    from tfmlops.config import Config

log = logging.getLogger(__name__)

SPEC = StageSpec(
    name="materialize",
    help="write the built-in dataset (digits or synthetic) as class folders",
    output="builtin",
    params=("seed", "data.builtin", "data.synthetic"),
    tracked=False,
)


def run(cfg: Config) -> dict[str, int]:
    # Staged and swapped in whole: a kill leaves the old folder or the new, never half.
    from tfmlops.stages.materialize.builtin import write_builtin

    with harness.stage(cfg, SPEC) as st:
        counts = write_builtin(cfg, st.out)
    log.info("materialize: %d %s images in %d classes -> %s", counts["images"], cfg.data.builtin,
             counts["classes"], cfg.paths.builtin)
    return counts
