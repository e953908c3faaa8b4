"""How closely another runtime reproduces the Keras model (NumPy only).

Parity means: on every test image the largest absolute difference between the
two probability vectors is at most `atol`, and the top-1 class is the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Parity:
    runtime: str
    images: int
    max_abs_diff: float
    top1_mismatches: int
    atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.atol and self.top1_mismatches == 0

    def describe(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        over = self.max_abs_diff - self.atol
        by = f" (over by {over:.3g})" if over > 0 else ""
        return (f"{self.runtime} parity {verdict}: max |{self.runtime} - keras| = "
                f"{self.max_abs_diff:.3g} vs atol {self.atol:g}{by}, "
                f"{self.top1_mismatches} of {self.images} top-1 labels differ")

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def compare(runtime: str, reference: np.ndarray, candidate: np.ndarray, atol: float) -> Parity:
    """`candidate` probabilities [N, K] against the Keras `reference` [N, K]."""
    if reference.shape != candidate.shape:
        raise ValueError(f"{runtime}: output shape {candidate.shape} != keras {reference.shape}")
    diff = float(np.max(np.abs(reference.astype(np.float64) - candidate.astype(np.float64))))
    mismatches = int(np.sum(np.argmax(reference, axis=1) != np.argmax(candidate, axis=1)))
    return Parity(runtime, int(len(reference)), diff, mismatches, float(atol))
