"""Config: every section, with the rules that span sections."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta, field

from tfmlops.config.messages import Rule, field_bounds, field_info
from tfmlops.config.sections.base import Section
from tfmlops.config.sections.data import DataConfig
from tfmlops.config.sections.export import ExportConfig
from tfmlops.config.sections.model import BlockSpec, ModelSpec
from tfmlops.config.sections.pipeline import PipelineConfig
from tfmlops.config.sections.promote import PromoteConfig
from tfmlops.config.sections.prune import PruneConfig
from tfmlops.config.sections.quantize import QuantizeConfig
from tfmlops.config.sections.shared import PathsConfig, ProfilingConfig, TrackingConfig
from tfmlops.config.sections.train import TrainConfig
from tfmlops.config.sections.tune import TuneConfig

MAX_FILTERS = field_bounds(field_info(BlockSpec, ["filters"]))[1]  # a block's widest


class Config(Section):
    seed: Annotated[int, Meta(ge=0, le=2**31 - 1)] = 42
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainConfig = field(default_factory=TrainConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)

    def _rules(self):
        self._search_space_can_be_built()
        self._backbones_fit_the_images()
        self._paths_are_not_the_projects_own()
        self._paths_do_not_overlap()

    def _search_space_can_be_built(self):
        # here so `tfmlops check` sees them; on Config because the pooling limit depends
        # on data.image_size
        problem = search_space_problem(self.tune.space, self.data.image_size)
        if problem:
            raise Rule(problem)

    def _backbones_fit_the_images(self):
        # Keras applications take inputs of at least 32x32 (model/builder.check_buildable)
        size = self.data.image_size
        for key, names in (("model.backbone", [self.model.backbone]),
                           ("tune.space.backbone", self.tune.space.backbone or [])):
            big = [n for n in names if n != "none"]
            if big and size < 32:
                raise Rule(f"{key}: {big[0]} needs inputs of at least 32x32, data.image_size is "
                           f"{size}; raise data.image_size or use backbone: none")

    def _paths_are_not_the_projects_own(self):
        # Every paths.* folder is written, swapped in or pruned by tfmlops (caches
        # evict, backups empty, profiles keep the newest runs): none may be a place
        # whose content is not the pipeline's.
        from tfmlops.project import refusal, store_uri

        store = store_uri(self.tracking.uri)  # MLFLOW_TRACKING_URI's store, when it is set
        for key, value in msgspec.structs.asdict(self.paths).items():
            why = refusal(value, store)
            if why:
                raise Rule(f"paths.{key}: {value!r} {why}, where tfmlops would delete or "
                           f"replace files; give paths.{key} a folder of its own (default "
                           f"{getattr(PathsConfig(), key)!r})")

    def _paths_do_not_overlap(self):
        # Outputs are swapped in whole (files.swap_in): an output folder that equals
        # or holds another path, or the user's images, would move it aside and
        # delete it. Two overlaps are by design: data.image_dir defaults to
        # paths.builtin (materialize writes what prepare reads), and
        # paths.profiles lies inside paths.reports (plain files, never swapped).
        named = {f"paths.{k}": v for k, v in msgspec.structs.asdict(self.paths).items()}
        named["data.image_dir"] = self.data.image_dir
        allowed = {("data.image_dir", "equals", "paths.builtin"),
                   ("paths.reports", "holds", "paths.profiles")}
        resolved = {k: Path(v).resolve() for k, v in named.items()}  # once: each stage loads it
        for a, b in itertools.combinations(named, 2):
            found = _overlap(a, resolved[a], b, resolved[b])
            if found is None or found in allowed:
                continue
            first, verb, second = found
            raise Rule(f"{first}: {named[first]!r} {verb} {second} {named[second]!r}; give "
                       "each of paths.* and data.image_dir its own folder, none inside another")

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    def digest(self, *sections: str) -> str:
        """A short hash of the resolved config (or of some sections)."""
        d = self.to_dict()
        if sections:
            d = {s: d[s] for s in sections}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _overlap(key_a: str, a: Path, key_b: str, b: Path) -> tuple[str, str, str] | None:
    """(key, "equals" | "holds", key) when two resolved paths overlap."""
    if a == b:
        first, second = sorted((key_a, key_b))
        return first, "equals", second
    if b in a.parents:
        return key_b, "holds", key_a
    if a in b.parents:
        return key_a, "holds", key_b
    return None


def search_space_problem(space, size: int) -> str | None:
    """Why the largest architecture of tune.space cannot be built on `size`x`size`
    images, else None (Config's rule, and tune's check before any work). The image rule
    first: for too many blocks it is the one that names the key to change."""
    pools = space.blocks.max - 1  # the last block feeds global pooling
    if pools >= size.bit_length():  # size // 2**pools < 1, without computing 2**pools
        return (f"tune.space.blocks.max: {space.blocks.max} blocks pool {pools} times, "
                f"more than a {size}x{size} input allows (at most {size.bit_length()} "
                "blocks); lower it or raise data.image_size")
    # each next block doubles the first width: the last must stay a valid width
    widest = max(space.filters) * 2**pools
    if widest > MAX_FILTERS:
        return (f"tune.space.filters: {max(space.filters)} doubled over "
                f"{space.blocks.max} blocks is {widest} filters, above {MAX_FILTERS}; "
                "lower tune.space.filters or tune.space.blocks.max")
    return None
