"""The one typed, validated view of params.yaml.

Every section of params.yaml maps to a frozen dataclass below. `load_config`
reads the file once, rejects unknown keys, wrong types and out-of-range values
with a `ConfigError` whose one-line message names the dotted key, the bad value
and what is accepted. Nothing here imports TensorFlow or MLflow.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tfmlops.errors import ConfigError


def _rng(lo: float | None = None, hi: float | None = None, *, lo_open=False, hi_open=False):
    """Field metadata: the accepted numeric range (closed unless said open)."""
    return {"range": (lo, hi, lo_open, hi_open)}


def _f(default, **meta):
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda: _copy(default), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(value):
    return copy.deepcopy(value)


# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in RGB shapes dataset, used for scale and RGB tests."""

    count: int = _f(1200, **_rng(20, 10_000_000))
    image_size: int = _f(32, **_rng(8, 1024))
    classes: int = _f(4, **_rng(2, 6))


@dataclass(frozen=True)
class SplitConfig:
    val: float = _f(0.15, **_rng(0.0, 0.5, lo_open=True))
    test: float = _f(0.15, **_rng(0.0, 0.5, lo_open=True))


@dataclass(frozen=True)
class StoreConfig:
    """How `prepare` stores each image: at a bounded size, in a chosen encoding."""

    # The stored short side in pixels (aspect kept, never enlarged); 0: data.image_size,
    # what training reads. A margin above it keeps detail for zoom augmentation.
    short_side: int = _f(0, **_rng(0, 8192))
    # auto: JPEG for JPEG/MPO sources (photos), PNG for the others (small, lossless).
    encoding: Literal["auto", "jpeg", "png"] = "auto"
    jpeg_quality: int = _f(90, **_rng(50, 100))


@dataclass(frozen=True)
class DataConfig:
    # The class-per-folder images prepare reads. The default is where the
    # `materialize` stage writes the built-in dataset; point it at your own.
    image_dir: str = "data/builtin"
    builtin: Literal["digits", "synthetic"] = "digits"
    image_size: int = _f(32, **_rng(8, 1024))
    channels: Literal[1, 3] = 1
    split: SplitConfig = _f(SplitConfig())
    max_bad_fraction: float = _f(0.05, **_rng(0.0, 1.0))
    shards: int = _f(2, **_rng(1, 1024))
    synthetic: SyntheticConfig = _f(SyntheticConfig())
    workers: int = _f(0, **_rng(0, 1024))  # prepare's decoding processes; 0: every core
    store: StoreConfig = _f(StoreConfig())


@dataclass(frozen=True)
class AugmentConfig:
    enabled: bool = False
    flip: bool = False  # digits are not mirror-symmetric: off by default
    rotation: float = _f(0.05, **_rng(0.0, 0.5))  # fraction of a full turn
    zoom: float = _f(0.1, **_rng(0.0, 0.9))
    translate: float = _f(0.1, **_rng(0.0, 0.5))


@dataclass(frozen=True)
class PipelineConfig:
    shuffle_buffer: int = _f(2048, **_rng(1, 10_000_000))
    cache: bool = True
    deterministic: bool = True
    # tf.data's autotuner records every element; once the cache serves the
    # epochs that cost halves steady-state throughput on 2 cores, so parallel
    # stages default to one call per core instead (benchmarks/input_pipeline.py).
    autotune: bool = False
    augment: AugmentConfig = _f(AugmentConfig())


# -------------------------------------------------------------------------- model

@dataclass(frozen=True)
class BlockSpec:
    filters: int = _f(32, **_rng(1, 4096))
    kernel_size: int = _f(3, **_rng(1, 15))
    separable: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """The architecture as data; `tfmlops.model.builder.build_model` builds it."""

    backbone: Literal["none", "mobilenet_v3_small", "efficientnet_b0"] = "none"
    backbone_weights: str | None = None  # a local weights file; never a hub download
    blocks: list[BlockSpec] = _f([BlockSpec(32, 3, False), BlockSpec(64, 3, False)])
    convs_per_block: int = _f(2, **_rng(1, 4))
    batch_norm: bool = True
    # Keras' default 0.99 averages ~100 steps: too slow for short runs on small
    # data (validation then sees stale statistics and scores near chance).
    bn_momentum: float = _f(0.9, **_rng(0.0, 1.0, hi_open=True))
    dropout: float = _f(0.25, **_rng(0.0, 0.9))
    pooling: Literal["max", "avg"] = "max"
    head_units: int = _f(128, **_rng(0, 8192))
    activation: Literal["relu", "relu6", "swish", "gelu", "elu"] = "relu"
    squeeze_excite: bool = False


# ---------------------------------------------------------------------- training

@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["adam", "adamw", "rmsprop", "sgd", "lamb"] = "adam"
    learning_rate: float = _f(0.002, **_rng(0.0, 10.0, lo_open=True))
    weight_decay: float = _f(0.0001, **_rng(0.0, 1.0))
    momentum: float = _f(0.9, **_rng(0.0, 1.0, hi_open=True))
    clipnorm: float | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    name: Literal[
        "constant", "exponential_decay", "cosine_decay", "cosine_warmup", "piecewise_constant"
    ] = "cosine_warmup"
    warmup_fraction: float = _f(0.1, **_rng(0.0, 0.9))
    decay_rate: float = _f(0.5, **_rng(0.0, 1.0, lo_open=True))
    alpha: float = _f(0.01, **_rng(0.0, 1.0))  # cosine floor as a fraction of the peak
    boundaries: list[float] = _f([0.5, 0.75])  # fractions of the total steps
    factors: list[float] = _f([1.0, 0.1, 0.01])  # multipliers of the peak, len(boundaries)+1


@dataclass(frozen=True)
class LossConfig:
    name: Literal["crossentropy", "focal"] = "crossentropy"
    label_smoothing: float = _f(0.0, **_rng(0.0, 0.5))
    gamma: float = _f(2.0, **_rng(0.0, 10.0))


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(20, **_rng(1, 10_000))
    batch_size: int = _f(64, **_rng(1, 65_536))  # per replica
    optimizer: OptimizerConfig = _f(OptimizerConfig())
    schedule: ScheduleConfig = _f(ScheduleConfig())
    loss: LossConfig = _f(LossConfig())
    reduce_lr_on_plateau: bool = False  # only with schedule.name == constant
    early_stopping_patience: int = _f(6, **_rng(0, 10_000))  # 0 turns it off
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    strategy: Literal["auto", "default", "mirrored", "multi_worker"] = "auto"
    replicas: int = _f(1, **_rng(1, 64))
    jit_compile: Literal["auto", "true", "false"] = "false"
    use_tuned: bool = True
    # Dotted keys ("optimizer.learning_rate", "model.dropout", "batch_size") that
    # win over the tune stage's best hyperparameters.
    overrides: dict[str, Any] = _f({})


# ------------------------------------------------------------------------ tuning

@dataclass(frozen=True)
class IntRange:
    min: int = 1
    max: int = 1
    step: int = 1


@dataclass(frozen=True)
class FloatRange:
    min: float = 0.0
    max: float = 0.0


@dataclass(frozen=True)
class SearchSpace:
    blocks: IntRange = _f(IntRange(1, 3, 1))
    filters: list[int] = _f([16, 32])  # first block; each next block doubles it
    separable: list[bool] = _f([False, True])
    batch_norm: list[bool] = _f([True, False])
    dropout: FloatRange = _f(FloatRange(0.0, 0.4))
    head_units: list[int] = _f([64, 128])
    optimizer: list[str] = _f(["adam", "adamw"])
    learning_rate: FloatRange = _f(FloatRange(5e-4, 5e-3))  # sampled on a log scale
    schedule: list[str] = _f(["constant", "cosine_warmup", "exponential_decay"])
    warmup_fraction: FloatRange = _f(FloatRange(0.0, 0.2))
    decay_rate: FloatRange = _f(FloatRange(0.3, 0.9))
    batch_size: list[int] = _f([32, 64])


@dataclass(frozen=True)
class TuneConfig:
    enabled: bool = True
    tuner: Literal["hyperband", "bayesian", "random"] = "hyperband"
    objective: Literal["val_accuracy", "val_loss"] = "val_accuracy"
    max_trials: int = _f(12, **_rng(1, 100_000))
    max_epochs: int = _f(6, **_rng(1, 10_000))
    budget_minutes: float = _f(3.5, **_rng(0.0, 100_000.0, lo_open=True))
    early_stopping_patience: int = _f(2, **_rng(0, 1000))
    hyperband_factor: int = _f(3, **_rng(2, 100))
    # The params' own settings and the search's best N are trained at
    # train.epochs; the winner (ties: the params') is the tuned configuration.
    final_candidates: int = _f(1, **_rng(0, 100))
    # A trial whose model has more parameters fails (recorded FAILED) and the
    # search goes on: keeps the search within an edge size budget. 0: no limit.
    max_model_params: int = _f(0, **_rng(0, None))
    space: SearchSpace = _f(SearchSpace())


# ---------------------------------------------------------------- compression

@dataclass(frozen=True)
class PruneConfig:
    initial_sparsity: float = _f(0.0, **_rng(0.0, 1.0, hi_open=True))
    final_sparsity: float = _f(0.85, **_rng(0.0, 1.0, hi_open=True))
    epochs: int = _f(30, **_rng(1, 10_000))  # fine-tuning epochs
    begin_fraction: float = _f(0.0, **_rng(0.0, 1.0, hi_open=True))
    end_fraction: float = _f(0.5, **_rng(0.0, 1.0, lo_open=True))  # final sparsity reached here
    frequency: int = _f(5, **_rng(1, 1_000_000))  # steps between mask updates
    learning_rate: float = _f(1e-3, **_rng(0.0, 10.0, lo_open=True))


@dataclass(frozen=True)
class QuantizeConfig:
    representative_samples: int = _f(200, **_rng(1, 10_000_000))
    qat: bool = False
    qat_epochs: int = _f(2, **_rng(1, 1000))
    qat_learning_rate: float = _f(1e-4, **_rng(0.0, 1.0, lo_open=True))
    accuracy_budget: float = _f(0.01, **_rng(0.0, 1.0))  # points lost vs Keras, as a fraction
    # The edge variant: the smallest file within the budget, or the fastest (p50).
    edge_pick: Literal["smallest", "fastest"] = "smallest"
    required: list[str] = _f(["int8"])  # variants whose failure fails the stage
    latency_runs: int = _f(200, **_rng(1, 1_000_000))
    latency_warmup: int = _f(20, **_rng(0, 1_000_000))
    threads: int = _f(1, **_rng(1, 256))


@dataclass(frozen=True)
class ExportConfig:
    model_name: str = "digits"
    onnx_opset: int = _f(17, **_rng(9, 23))
    atol: float = _f(1e-4, **_rng(0.0, 1.0))
    latency_runs: int = _f(200, **_rng(1, 1_000_000))


@dataclass(frozen=True)
class GateConfig:
    min_accuracy: float = _f(0.95, **_rng(0.0, 1.0))
    max_regression: float = _f(0.005, **_rng(0.0, 1.0))
    max_size_bytes: int = _f(5_000_000, **_rng(1, None))
    max_latency_ms: float = _f(20.0, **_rng(0.0, None, lo_open=True))
    require_parity: bool = True


@dataclass(frozen=True)
class PromoteConfig:
    registered_model: str = "digits-classifier"
    gate: GateConfig = _f(GateConfig())
    fail_pipeline: bool = False


# -------------------------------------------------------------------- shared

@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = True
    experiment: str = "tfmlops"
    # Used only when MLFLOW_TRACKING_URI is unset; relative sqlite paths are
    # resolved against the repository root (never a `dvc exp --temp` copy).
    uri: str = "sqlite:///mlflow.db"
    connect_timeout_s: float = _f(5.0, **_rng(0.1, 600.0))
    retries: int = _f(3, **_rng(0, 20))


@dataclass(frozen=True)
class ProfilingConfig:
    enabled: bool = True
    start_step: int = _f(5, **_rng(1, 1_000_000))  # skip warm-up and tracing steps
    steps: int = _f(3, **_rng(1, 1000))


@dataclass(frozen=True)
class PathsConfig:
    """Every path the pipeline reads or writes; dvc.yaml reads these too (${paths.*})."""

    builtin: str = "data/builtin"  # materialize: the built-in dataset as class folders
    prepared: str = "data/prepared"  # prepare: TFRecords, manifest.json, stats.json
    prepare_cache: str = "data/prepare_cache"  # prepare: per-image results by content hash
    tuner: str = "data/tuner"  # tune: keras-tuner state, kept between runs
    tuned: str = "models/tuned"  # tune: best_hparams.yaml
    train: str = "models/train"  # train: model.keras
    backup: str = "models/train_backup"  # train: BackupAndRestore state, kept on a kill
    pruned: str = "models/pruned"  # prune: the pruned tf_keras model
    tflite: str = "models/tflite"  # quantize: every .tflite variant
    export: str = "models/export"  # export: SavedModel, ONNX, edge TFLite
    reports: str = "reports"  # metrics and plots of every stage
    profiles: str = "reports/profiles"  # TensorFlow Profiler traces, per stage


@dataclass(frozen=True)
class Config:
    seed: int = _f(42, **_rng(0, 2**31 - 1))
    paths: PathsConfig = _f(PathsConfig())
    data: DataConfig = _f(DataConfig())
    pipeline: PipelineConfig = _f(PipelineConfig())
    model: ModelSpec = _f(ModelSpec())
    train: TrainConfig = _f(TrainConfig())
    tune: TuneConfig = _f(TuneConfig())
    prune: PruneConfig = _f(PruneConfig())
    quantize: QuantizeConfig = _f(QuantizeConfig())
    export: ExportConfig = _f(ExportConfig())
    promote: PromoteConfig = _f(PromoteConfig())
    tracking: TrackingConfig = _f(TrackingConfig())
    profiling: ProfilingConfig = _f(ProfilingConfig())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self, *sections: str) -> str:
        """A short hash of the resolved config (or of some sections)."""
        d = self.to_dict()
        if sections:
            d = {s: d[s] for s in sections}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------- the loader

def load_config(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Config:
    """Read and validate params.yaml; `overrides` maps dotted keys to values."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found; run from the project root or pass --params PATH")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML; fix the syntax") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    for dotted, value in (overrides or {}).items():
        set_dotted(raw, dotted, value)
    return from_dict(Config, raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    return from_dict(Config, raw)


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
    if dataclasses.is_dataclass(tree):
        tree = dataclasses.asdict(tree)
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, list) and any(isinstance(v, dict) for v in tree):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out


def from_dict(cls, data: Any, path: str = ""):
    """Build dataclass `cls` from `data`, validating as it goes."""
    if dataclasses.is_dataclass(data):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'params'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{key}: unknown key; accepted keys here: {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        key = f"{path}.{name}" if path else name
        value = _coerce(hints[name], data[name], key)
        _check_range(f, value, key)
        kwargs[name] = value
    obj = cls(**kwargs)
    _check_invariants(obj, path)
    return obj


def _coerce(tp, value, key):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
    if origin is Literal:
        if value not in args or type(value) is not type(args[0]):
            raise ConfigError(
                f"{key}: {value!r} is not accepted; use one of {', '.join(map(repr, args))}"
            )
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {key}")


def _check_range(f: dataclasses.Field, value, key: str) -> None:
    spec = f.metadata.get("range")
    if spec is None or value is None:
        return
    lo, hi, lo_open, hi_open = spec
    bad = (lo is not None and (value < lo or (lo_open and value == lo))) or (
        hi is not None and (value > hi or (hi_open and value == hi))
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        shown = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ConfigError(f"{key}: {value!r} is out of range; accepted: {shown}")


def _check_invariants(obj, path: str) -> None:
    """Rules that span several keys of one section."""
    p = f"{path}." if path else ""
    if isinstance(obj, (IntRange, FloatRange)):
        if obj.min > obj.max:
            raise ConfigError(f"{path}: min {obj.min} > max {obj.max}; give min <= max")
        if isinstance(obj, IntRange) and (obj.min < 1 or obj.step < 1):
            raise ConfigError(f"{path}: min and step must be >= 1, got {obj}")
        if isinstance(obj, FloatRange) and obj.min < 0:
            raise ConfigError(f"{path}: min must be >= 0, got {obj.min}")
    elif isinstance(obj, SearchSpace):
        _check_space(obj, path)
    elif isinstance(obj, DataConfig):
        if 0 < obj.store.short_side < obj.image_size:
            raise ConfigError(
                f"{p}store.short_side: {obj.store.short_side} is below {p}image_size "
                f"{obj.image_size}; give 0 (= image_size) or at least {obj.image_size}"
            )
    elif isinstance(obj, SplitConfig):
        if obj.val + obj.test >= 0.9:
            raise ConfigError(f"{p}val + {p}test = {obj.val + obj.test}; keep it below 0.9")
    elif isinstance(obj, ScheduleConfig):
        if len(obj.factors) != len(obj.boundaries) + 1:
            raise ConfigError(
                f"{p}factors: needs len(boundaries)+1 = {len(obj.boundaries) + 1} values, "
                f"got {len(obj.factors)}"
            )
        if any(not 0 < b < 1 for b in obj.boundaries) or obj.boundaries != sorted(obj.boundaries):
            raise ConfigError(
                f"{p}boundaries: {obj.boundaries} must be increasing fractions in (0, 1)"
            )
    elif isinstance(obj, TrainConfig):
        if obj.reduce_lr_on_plateau and obj.schedule.name != "constant":
            raise ConfigError(
                f"{p}reduce_lr_on_plateau: only works with {p}schedule.name: constant, "
                f"not {obj.schedule.name!r}"
            )
    elif isinstance(obj, ModelSpec):
        if obj.backbone == "none" and not obj.blocks:
            raise ConfigError(f"{p}blocks: empty; give at least one block or a backbone")
    elif isinstance(obj, PruneConfig):
        if obj.final_sparsity < obj.initial_sparsity:
            raise ConfigError(
                f"{p}final_sparsity: {obj.final_sparsity} < initial_sparsity "
                f"{obj.initial_sparsity}; final must be >= initial"
            )
        if obj.end_fraction <= obj.begin_fraction:
            raise ConfigError(f"{p}end_fraction: must be > begin_fraction ({obj.begin_fraction})")
    elif isinstance(obj, QuantizeConfig):
        bad = sorted(set(obj.required) - set(TFLITE_VARIANTS))
        if bad:
            raise ConfigError(
                f"{p}required: {bad[0]!r} is not a variant; use some of {', '.join(TFLITE_VARIANTS)}"
            )
        if "qat_int8" in obj.required and not obj.qat:
            raise ConfigError(f"{p}required: lists qat_int8 but {p}qat is false; "
                              f"set {p}qat: true or remove qat_int8")


TFLITE_VARIANTS = ("float32", "dynamic", "float16", "int8", "int8_sparse", "qat_int8")
OPTIMIZERS = typing.get_args(typing.get_type_hints(OptimizerConfig)["name"])
SCHEDULES = typing.get_args(typing.get_type_hints(ScheduleConfig)["name"])


def _check_space(space: SearchSpace, path: str) -> None:
    choices = {
        "filters": (space.filters, None),
        "separable": (space.separable, None),
        "batch_norm": (space.batch_norm, None),
        "head_units": (space.head_units, None),
        "optimizer": (space.optimizer, OPTIMIZERS),
        "schedule": (space.schedule, SCHEDULES),
        "batch_size": (space.batch_size, None),
    }
    for name, (values, allowed) in choices.items():
        key = f"{path}.{name}"
        if not values:
            raise ConfigError(f"{key}: empty choice list; give at least one value")
        if allowed is not None:
            for v in values:
                if v not in allowed:
                    raise ConfigError(
                        f"{key}: {v!r} is not accepted; use some of {', '.join(allowed)}"
                    )
        if name in ("filters", "head_units", "batch_size") and min(values) < 1:
            raise ConfigError(f"{key}: values must be >= 1, got {values}")
    if space.learning_rate.min <= 0:
        raise ConfigError(f"{path}.learning_rate.min: must be > 0 for a log scale")
    if space.dropout.max >= 1:
        raise ConfigError(f"{path}.dropout.max: must be < 1, got {space.dropout.max}")
    # tune: each sampled value must also be a valid model/train setting.
    for name, values in choices.items():
        dupes = sorted({repr(v) for v in values[0] if values[0].count(v) > 1})
        if dupes:
            raise ConfigError(f"{path}.{name}: {dupes[0]} is listed twice; list each value once")
    bounds = {  # key: (lowest accepted min, highest accepted max, min must be > low)
        "dropout": (0.0, 0.9, False),
        "learning_rate": (0.0, 10.0, True),
        "warmup_fraction": (0.0, 0.9, False),
        "decay_rate": (0.0, 1.0, True),
    }
    for name, (low, high, open_low) in bounds.items():
        r = getattr(space, name)
        if r.min < low or (open_low and r.min == low) or r.max > high:
            left = "(" if open_low else "["
            raise ConfigError(
                f"{path}.{name}: [{r.min}, {r.max}] is outside {left}{low}, {high}]; "
                "narrow the range"
            )
    if max(space.filters) > 4096:
        raise ConfigError(f"{path}.filters: values must be <= 4096, got {space.filters}")
