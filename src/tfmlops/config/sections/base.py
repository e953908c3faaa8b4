"""What every section module shares: the frozen, strict Struct base and the value
types taken as written."""

from __future__ import annotations

import math
import threading
from typing import Annotated

import msgspec
from msgspec import Meta, field

from tfmlops.config.messages import Rule

# Values are taken as written (msgspec.convert(..., strict=True)): no "yes" for true,
# no "3", 3.0 or true for 3; an integer is taken as a float. inf and nan: Section.
Text = Annotated[str, Meta(min_length=1)]
_restoring = threading.local()


def copies(*values):
    """A default_factory: a fresh list per instance."""
    return field(default_factory=lambda: list(values))


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A section (or part of one): its fields are checked first, refusing inf and nan
    (msgspec takes them), then its own rules (`_rules`, raising messages.Rule)."""

    def __post_init__(self):
        if getattr(_restoring, "on", False):
            return
        for name in self.__struct_fields__:
            value = getattr(self, name)
            for i, v in enumerate(value) if isinstance(value, list) else [(None, value)]:
                if isinstance(v, float) and not math.isfinite(v):
                    where = "" if i is None else f"[{i}]"
                    raise Rule(f"{{p}}{name}{where}: expected a finite number, got {v!r}")
        self._rules()

    def _rules(self) -> None:
        pass

    def __reduce__(self):
        # Unpickled (the tracking sidecar gets the config) or deep-copied as it is: it was
        # validated where it was made, and its rules read the machine and the folders.
        return _restore, (type(self), tuple(getattr(self, f) for f in self.__struct_fields__))


def _restore(cls: type[Section], values: tuple) -> Section:
    _restoring.on = True
    try:
        return cls(*values)
    finally:
        _restoring.on = False
