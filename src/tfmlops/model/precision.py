"""Which Keras dtype policy a run uses, and proof that loss scaling is on.

`train.precision: auto` is decided from the hardware and the architecture alone, never
from a timing, so the same commit trains the same numerics on the same machine:
- `mixed_float16` on CUDA GPUs of compute capability 7.0 or newer (tensor cores);
- `mixed_bfloat16` on a CPU with AMX-BF16 tiles (`/proc/cpuinfo` flag `amx_bf16`)
  for an architecture of dense convolutions only (the plain blocks without separable
  ones, or ResNet50): the tiles run those faster in bf16, while depthwise convolutions
  and the casts around them are slower in bf16 (MobileNetV3Small, EfficientNetB0), and
  AVX512-BF16 alone gained the digits CNN little (BENCHMARKS.md, figures behind the code);
- `float32` everywhere else.
`train.precision: timed` (opt-in) times float32 against mixed_bfloat16 on a few training
steps of the actual model on a CPU with bf16 units (`avx512_bf16` or `amx_bf16`) and keeps
float32 unless bf16 is faster by more than `train.precision_margin`; tune records each
timed decision (`cache_key`: spec, input shape, batch) in a file train reuses.

`mixed_float16` needs loss scaling; Keras 3 `compile` wraps the optimizer in a
`LossScaleOptimizer` when the model's policy is mixed_float16, and
`uses_loss_scaling` checks that it did. The model's last layer computes in
float32 whatever the policy (see model/builder.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec

log = logging.getLogger(__name__)

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
MIN_FLOAT16_CAPABILITY = (7, 0)  # Volta: the first tensor cores
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU units that compute bf16 natively
AMX_FLAG = "amx_bf16"  # the matrix tiles that make bf16 pay off for dense convolutions
DENSE_BACKBONES = ("none", "resnet50")  # no depthwise convolutions (the plain blocks: unless separable)

_decided: dict[str, PrecisionChoice] = {}  # this process's decisions, by cache_key


@dataclass(frozen=True)
class PrecisionChoice:
    """The policy `train.precision` resolved to, why, and the timings behind it."""

    policy: str
    # "setting", "gpu", "amx-dense", "no-amx", "depthwise", "no-bf16-units", "timed", "not-timed"
    reason: str
    images_per_s: dict[str, float] = field(default_factory=dict)  # per timed policy
    margin: float | None = None  # timed: how much faster bf16 had to be

    def line(self, setting: str) -> str:
        """The one log line of this decision."""
        why = {"setting": "as set", "gpu": "CUDA GPUs; mixed_float16 needs capability >= 7.0",
               "amx-dense": "CPU with AMX-BF16 tiles, dense convolutions only",
               "no-amx": "CPU without AMX-BF16 tiles (amx_bf16)",
               "depthwise": "depthwise convolutions gain nothing in bf16",
               "no-bf16-units": f"CPU without bf16 units ({'/'.join(BF16_FLAGS)})",
               "not-timed": "bf16 units, not timed: workers must agree"}.get(self.reason)
        if self.reason == "timed":
            why = ("timed: " + ", ".join(f"{p} {v:,.0f} images/s"
                                         for p, v in self.images_per_s.items())
                   + f"; bf16 must be more than {100 * (self.margin or 0):g}% faster")
        return f"precision: {setting} -> {self.policy} ({why})"

    def mlflow(self) -> tuple[dict, dict]:
        """(params, metrics) for a run: the choice, why, and each timed images/s."""
        params = {"precision_policy": self.policy, "precision_reason": self.reason}
        if self.margin is not None:
            params["precision_margin"] = self.margin
        metrics = {f"precision_{p}_images_per_s": round(v, 1)
                   for p, v in self.images_per_s.items()}
        return params, metrics


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (`flags` lines of /proc/cpuinfo; empty where there is none)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:  # not Linux: no flags known, so no bf16 claimed
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


def has_bf16_units(flags: Iterable[str]) -> bool:
    return any(f in set(flags) for f in BF16_FLAGS)


def dense_only(spec) -> bool:
    """True when the architecture has no depthwise convolutions (what bf16 tiles speed up)."""
    if spec is None:
        return True
    if spec.backbone != "none":
        return spec.backbone in DENSE_BACKBONES
    return not any(block.separable for block in spec.blocks)


def choose_policy(setting: str, gpu_capabilities: Sequence[tuple[int, int]],
                  flags: Iterable[str] = (), measure: Callable[[], dict[str, float]] | None = None,
                  spec=None, margin: float = 0.0) -> PrecisionChoice:
    """The policy for `train.precision`, given the GPUs' compute capabilities, the CPU's
    flags, the architecture (`spec`, a ModelSpec; None: dense convolutions) and, for
    `timed` only, `measure` (-> images/s of float32 and mixed_bfloat16 on the actual
    model; called only on a CPU with bf16 units) with the `margin` bf16 must beat.
    Explicit settings are kept as they are."""
    if setting in POLICIES:
        return PrecisionChoice(setting, "setting")
    if setting not in ("auto", "timed"):
        raise ValueError(f"unknown precision {setting!r}")
    flags = set(flags)
    if gpu_capabilities:
        if all(tuple(c) >= MIN_FLOAT16_CAPABILITY for c in gpu_capabilities):
            return PrecisionChoice("mixed_float16", "gpu")
        return PrecisionChoice("float32", "gpu")  # older or mixed fleets: the safe policy
    if setting == "auto":
        if AMX_FLAG not in flags:
            return PrecisionChoice("float32", "no-bf16-units" if not has_bf16_units(flags) else "no-amx")
        return PrecisionChoice(*(("mixed_bfloat16", "amx-dense") if dense_only(spec)
                          else ("float32", "depthwise")))
    if not has_bf16_units(flags):
        return PrecisionChoice("float32", "no-bf16-units")
    if measure is None:
        return PrecisionChoice("float32", "not-timed")
    timings = measure()
    return PrecisionChoice(faster(timings, margin), "timed", timings, margin)


def faster(images_per_s: dict[str, float], margin: float = 0.0) -> str:
    """float32 unless another policy has more than (1 + `margin`) x its images/s (then the
    fastest of those): a close timing keeps float32 (no rounding cost)."""
    base = images_per_s.get("float32", 0.0)
    better = {p: v for p, v in images_per_s.items() if p != "float32" and v > base * (1 + margin)}
    return max(better, key=better.get) if better else "float32"


def gpu_capabilities() -> list[tuple[int, int]]:
    """Compute capability of every visible CUDA GPU (empty on CPU-only machines)."""
    import tensorflow as tf

    capabilities = (tf.config.experimental.get_device_details(gpu).get("compute_capability")
                    for gpu in tf.config.list_physical_devices("GPU"))
    return [tuple(c) if c else (0, 0) for c in capabilities]


def time_policies(make_model: Callable[[], object], batch, keras,
                  policies: Sequence[str] = ("float32", "mixed_bfloat16"), warmup: int = 2,
                  steps: int = 5) -> dict[str, float]:
    """Training images/s of each policy: `make_model()` (a compiled model) is built
    under the policy, trains `warmup` steps on `batch` (tracing, first-call costs),
    then `steps` timed steps; the median step counts. The global policy is restored."""
    x, y = batch
    images = int(x.shape[0])
    out = {}
    for policy in policies:
        with global_policy(policy, keras):
            model = make_model()
            for _ in range(warmup):
                model.train_on_batch(x, y)
            seconds = []
            for _ in range(steps):
                started = time.perf_counter()
                model.train_on_batch(x, y)
                seconds.append(time.perf_counter() - started)
        out[policy] = images / statistics.median(seconds)
    return out


def cache_key(spec, input_shape, batch_size: int, flags: Iterable[str] = ()) -> str:
    """What a timing depends on: the architecture, the input, the batch and the CPU."""
    payload = json.dumps({"spec": msgspec.to_builtins(spec), "input": list(input_shape), "batch": batch_size,
                          "bf16": sorted(set(flags) & set(BF16_FLAGS))},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def choose_cached(setting: str, key: str, flags: Iterable[str],
                  measure: Callable[[], dict[str, float]] | None, file: str | Path | None = None,
                  write: bool = True, spec=None, margin: float = 0.0) -> tuple[PrecisionChoice, bool]:
    """`choose_policy`, remembered in this process (per `setting` and `key`, the architecture)
    and, for a timing, in `file` (another process of the same tune reuses it); returns
    (decision, made now). With `write` False the file is only read (another stage's
    output). Without a `file` a timing is not reused."""
    timed = setting == "timed" and has_bf16_units(flags) and measure is not None

    def gpus():
        return gpu_capabilities() if setting in ("auto", "timed") else []

    if timed and file is None:
        return choose_policy(setting, gpus(), flags, measure, spec, margin), True
    memo = f"{setting}:{key}:{margin:g}" if timed else f"{setting}:{key}"
    if memo in _decided:
        return _decided[memo], False
    from tfmlops.files import read_json, write_json  # a damaged cache only costs a new timing

    stored = read_json(file, {}).get(memo) if timed else None
    if stored is not None:
        _decided[memo] = PrecisionChoice(**stored)
        return _decided[memo], False
    decision = choose_policy(setting, gpus(), flags, measure if timed else None, spec, margin)
    _decided[memo] = decision
    if timed and write:
        write_json(file, {**read_json(file, {}), memo: asdict(decision)})
    return decision, True


@contextlib.contextmanager
def global_policy(policy: str, keras) -> Iterator[None]:
    """Keras' global dtype policy for the block, then the previous one again. The policy
    is read when layers are created: build the model inside the block."""
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def uses_loss_scaling(model, keras) -> bool:
    """True when the compiled model's optimizer scales the loss (needed for float16)."""
    return isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)


def inner_optimizer(optimizer):
    """The optimizer that holds the learning rate (unwraps a LossScaleOptimizer)."""
    return getattr(optimizer, "inner_optimizer", optimizer)
