"""What every section module shares: the frozen, strict dataclass decorator and
the value types taken as written."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StringConstraints
from pydantic.dataclasses import dataclass

_SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)
section = dataclass(frozen=True, config=_SECTION)

# Values are taken as written: no "yes" for true, no "3" or 3.0 for 3, no inf.
Int = StrictInt
Bool = StrictBool
Float = Annotated[float, Field(strict=True)]  # an integer is taken as a float
Text = Annotated[str, StringConstraints(strict=True, min_length=1)]


def copies(*values):
    """A default_factory: a fresh list per instance."""
    return Field(default_factory=lambda: list(values))
