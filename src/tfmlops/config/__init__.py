"""The one typed, validated view of params.yaml.

Every section of params.yaml maps to a frozen msgspec Struct
(`sections/`, one module per section). `load_config` reads the file once; an unknown key, a wrong
type, an out-of-range value or a broken cross-key rule raises a `ConfigError`
whose one-line message (`messages.py`) names the dotted key, the bad value and
what is accepted. Nothing here imports TensorFlow, MLflow or pydantic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from tfmlops.config.messages import one_line
from tfmlops.config.sections.data import SyntheticConfig
from tfmlops.config.sections.export import ServingLimits
from tfmlops.config.sections.model import BACKBONES, IMAGENET, BlockSpec, ModelSpec
from tfmlops.config.sections.promote import GateConfig
from tfmlops.config.sections.prune import PruneConfig
from tfmlops.config.sections.root import Config
from tfmlops.config.sections.shared import TrackingConfig
from tfmlops.config.sections.train import LossConfig, OptimizerConfig, ScheduleConfig
from tfmlops.config.sections.tune import HP_NAMES, SEARCHED_PARAMS, FloatRange, IntRange, SearchSpace
from tfmlops.errors import ConfigError

# What other packages import from here; the rest of each section's names stay in its module.
__all__ = [
    "BACKBONES", "HP_NAMES", "IMAGENET", "SEARCHED_PARAMS", "BlockSpec", "Config", "ConfigError",
    "FloatRange", "GateConfig", "IntRange", "LossConfig", "ModelSpec", "OptimizerConfig",
    "PruneConfig", "ScheduleConfig", "SearchSpace", "ServingLimits", "SyntheticConfig",
    "TrackingConfig", "config_from_dict", "flatten", "load_config", "replace", "set_dotted",
]

S = TypeVar("S", bound=msgspec.Struct)
# libyaml's safe loader where PyYAML was built with it: about 9x faster on params.yaml,
# which every command reads first (BENCHMARKS.md, figures behind the code).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Config:
    """Read and validate params.yaml; `overrides` maps dotted keys to values."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found; run from the project root or pass --params PATH")
    try:
        raw = yaml.load(path.read_text(), Loader=_LOADER) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML; fix the syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    for dotted, value in (overrides or {}).items():
        set_dotted(raw, dotted, value)
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    """A validated Config from a params tree (missing keys take their defaults; anything
    but a mapping is refused as `params: expected a mapping, got ...`)."""
    return _validated(raw, Config)


def replace(obj: S, **changes: Any) -> S:
    """A copy of a section (or Config) with `changes`, validated as params are: a
    ConfigError names the key. Unchanged nested sections are kept as they are."""
    raw = {name: getattr(obj, name) for name in obj.__struct_fields__}
    return _validated({**raw, **changes}, type(obj))


def _validated(raw: dict[str, Any], cls: type[S]) -> S:
    try:
        return msgspec.convert(raw, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(one_line(exc, cls, raw)) from None


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: '{k}' is not a section")
    node[keys[-1]] = value


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists of mappings get an index."""
    out: dict[str, Any] = {}
    if isinstance(tree, msgspec.Struct):
        tree = msgspec.to_builtins(tree)
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, list) and any(isinstance(v, dict) for v in tree):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out
