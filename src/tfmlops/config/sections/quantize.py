"""quantize: the TFLite variants built from each model and how they are judged.

The variant names live here, the one list config validates, compress/tflite
converts and quantize builds."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from tfmlops.config.messages import Rule
from tfmlops.config.sections.base import Section, Text, copies

FLOAT32 = "float32"  # no optimization
DYNAMIC = "dynamic"  # int8 weights, float activations at run time
FLOAT16 = "float16"  # float16 weights
INT8 = "int8"  # full integer, calibrated on a representative dataset
INT8_SPARSE = "int8_sparse"  # int8 with pruned tensors in TFLite's sparse format
QAT_INT8 = "qat_int8"  # int8 of the quantization-aware fine-tuned pruned model

BASE_VARIANTS = (FLOAT32, DYNAMIC, FLOAT16, INT8)
# Sparse encoding only pays where pruning made zeros: built for the pruned model.
PRUNED_ONLY_VARIANTS = (INT8_SPARSE,)
# What `quantize.variants` may list (QAT's variant comes from `quantize.qat` instead).
CONVERTED_VARIANTS = BASE_VARIANTS + PRUNED_ONLY_VARIANTS
# Every name `quantize.required` accepts, in frontier order.
TFLITE_VARIANTS = CONVERTED_VARIANTS + (QAT_INT8,)
QAT_VARIANT = f"pruned_{QAT_INT8}"  # the QAT model is always the pruned one


def _only_of(key: str, names: list, allowed: tuple, what: str) -> None:
    """A Rule naming the first of `names` (the list at `key`) not in `allowed`."""
    bad = sorted(set(names) - set(allowed))
    if bad:
        raise Rule(f"{{p}}{key}: {bad[0]!r} is not {what}; use some of {', '.join(allowed)}")


class QuantizeConfig(Section):
    representative_samples: Annotated[int, Meta(ge=1, le=10_000_000)] = 200
    qat: bool = False
    qat_epochs: Annotated[int, Meta(ge=1, le=1000)] = 2
    qat_learning_rate: Annotated[float, Meta(gt=0.0, le=1.0)] = 1e-4
    accuracy_budget: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01  # points lost vs Keras, as a fraction
    # The edge variant: the smallest file within the budget, or the fastest (p50).
    edge_pick: Literal["smallest", "fastest"] = "smallest"
    required: list[Text] = copies("int8")  # variants whose failure fails the stage
    # The variants converted from each model (trained and pruned); every conversion is
    # evaluated and timed, so a shorter list is a faster stage.
    variants: list[Text] = copies(*CONVERTED_VARIANTS)
    latency_runs: Annotated[int, Meta(ge=1, le=1_000_000)] = 200
    latency_warmup: Annotated[int, Meta(ge=0, le=1_000_000)] = 20
    threads: Annotated[int, Meta(ge=1, le=256)] = 1

    def _rules(self):
        _only_of("required", self.required, TFLITE_VARIANTS, "a variant")
        if not self.variants:
            raise Rule(f"{{p}}variants: empty; list at least one of {', '.join(CONVERTED_VARIANTS)}")
        _only_of("variants", self.variants, CONVERTED_VARIANTS, "a converted variant")
        # the QAT variant needs qat
        if QAT_INT8 in self.required and not self.qat:
            raise Rule(f"{{p}}required: lists {QAT_INT8} but {{p}}qat is false; "
                       f"set {{p}}qat: true or remove {QAT_INT8}")
        missing = sorted(set(self.required) - set(self.variants) - {QAT_INT8})
        if missing:
            raise Rule(f"{{p}}required: lists {missing[0]} but {{p}}variants does not build it; "
                       f"add it to {{p}}variants or remove it from {{p}}required")
