"""msgspec's ValidationError as the one line a user reads.

`one_line` says one problem as `<dotted key>: <what is wrong>; <what is accepted>`,
e.g. `train.epochs: 0 is out of range; accepted: [1, 10000]`. msgspec stops at its
first error, worded like "Expected `int` >= 1 - at `$.train.epochs`": the key is
that path, the bad value is read from the raw params at it, and the bounds or
choices from the Structs' annotations (`Meta`, `Literal`). Unknown keys are looked
for in the raw params first (msgspec meets keys in input order). The sections' own
rules raise `Rule`, whose text names its keys relative to the section.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from typing import Any, Literal

import msgspec

from tfmlops.config.credentials import SECRET_BEARING

_AT = re.compile(r" - at `(key` in `)?\$([^`]*)`$")  # msgspec's path, ending its message
_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")  # `.name` or `[index]` in that path
_RANGE = re.compile(r"Expected `\w+` [<>]=? ")  # a Meta(ge/gt/le/lt) bound refused it
WRONG_TYPE = {int: "an integer", float: "a number", bool: "true or false",
              str: "a non-empty string", list: "a list", dict: "a mapping"}


class Rule(ValueError):
    """A rule across keys of one section broke. In its text `{path}` stands for
    the dotted key of the section that checks it and `{p}` for that key as a prefix
    (`data.split.`), which only the formatter knows."""

    def render(self, path: str, section: str) -> str:
        prefix = f"{section}." if section else ""
        return str(self).replace("{path}", path).replace("{p}", prefix)


def dotted(loc: tuple) -> str:
    """('model', 'blocks', 0, 'filters') -> 'model.blocks[0].filters'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def is_section(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def field_info(root: type, loc: list | tuple):
    """The declared type (Annotated bounds kept) at `loc` under `root`, else None."""
    tp = root
    for part in loc:
        bare = _bare(tp)
        if isinstance(part, int) and typing.get_origin(bare) is list:
            tp = typing.get_args(bare)[0]  # into a list: its item type
        elif is_section(bare) and part in _fields(bare):
            tp = _fields(bare)[part]
        else:
            return None
    return tp


def field_bounds(tp) -> tuple[Any, Any, bool, bool]:
    """(low, high, low_open, high_open) of a type's Meta(ge/gt/le/lt) bounds."""
    lo = hi = None
    lo_open = hi_open = False
    for m in _metas(tp):
        if m.ge is not None or m.gt is not None:
            lo, lo_open = (m.ge, False) if m.gt is None else (m.gt, True)
        if m.le is not None or m.lt is not None:
            hi, hi_open = (m.le, False) if m.lt is None else (m.lt, True)
    return lo, hi, lo_open, hi_open


def one_line(exc: msgspec.ValidationError, root: type, raw: Any) -> str:
    """`exc` (from converting `raw` to `root`) on one line; an unknown key first."""
    unknown = _unknown(raw, root, ())
    if unknown:
        return unknown
    text, loc, in_key = _where(str(exc))
    key, value, tp = dotted(loc) or "params", _value_at(raw, loc), field_info(root, loc)
    if any(loc[:len(k)] == k for k in SECRET_BEARING):  # may be a credential: never echoed
        value = _Hidden(value)
    if isinstance(exc.__cause__, Rule):  # raised by a section's __post_init__ at `loc`
        return exc.__cause__.render(dotted(loc), dotted(loc))
    if in_key:
        return f"{key}: expected string keys ({text})"
    if text.startswith("Expected `array` of length >= 1"):
        return f"{key}: empty choice list; give at least one value"
    if _choices(tp):  # Literal: any refused value, of any type, is not one of them
        in_list = bool(loc) and isinstance(loc[-1], int)
        return (f"{dotted(loc[:-1]) if in_list else key}: {value!r} is not accepted; use "
                f"{'some' if in_list else 'one'} of {', '.join(map(repr, _choices(tp)))}")
    if _RANGE.match(text) and isinstance(value, float) and not math.isfinite(value):
        return f"{key}: expected a finite number, got {value!r}"  # nan fails every bound
    if _RANGE.match(text):
        return f"{key}: {value!r} is out of range; accepted: {_shown(tp)}"
    if text.startswith("Expected `"):  # a wrong type (or an empty string)
        return f"{key}: expected {_expected(tp)}, got {value!r}"
    return f"{key}: {text}, got {value!r}"


class _Hidden:
    """A refused value shown by its type only (credentials.SECRET_BEARING)."""

    def __init__(self, value: Any):
        self.kind = type(value).__name__

    def __repr__(self) -> str:
        return f"a value of type {self.kind} (not shown: it may hold a credential)"


def reason(exc: msgspec.ValidationError) -> str:
    """What `exc` says, without its path (a Rule's keys relative to the value)."""
    text, loc, _ = _where(str(exc))
    if isinstance(exc.__cause__, Rule):
        return exc.__cause__.render(dotted(loc) or "value", dotted(loc))
    return text


# ------------------------------------------------------------------ helpers

def _where(message: str) -> tuple[str, tuple, bool]:
    """("Expected `int` >= 1", ("train", "epochs"), False) from msgspec's message; the
    flag: the error is in a mapping's key."""
    m = _AT.search(message)
    if not m:
        return message, (), False
    loc = tuple(name if name else int(index) for name, index in _PART.findall(m.group(2)))
    return message[:m.start()], loc, bool(m.group(1))


def _value_at(raw: Any, loc: tuple) -> Any:
    for part in loc:
        if isinstance(raw, dict):
            raw = raw.get(part)
        elif isinstance(raw, list) and isinstance(part, int) and part < len(raw):
            raw = raw[part]
        else:
            raw = getattr(raw, part, None) if isinstance(part, str) else None
    return raw


def _unknown(raw: Any, tp, loc: tuple) -> str | None:
    """The first key of `raw` that the Struct at `loc` does not have, as a message."""
    bare = _bare(tp)
    if isinstance(raw, list) and typing.get_origin(bare) is list:
        item = typing.get_args(bare)[0]
        return next(filter(None, (_unknown(v, item, (*loc, i)) for i, v in enumerate(raw))), None)
    if not (isinstance(raw, dict) and is_section(bare)):
        return None
    fields = _fields(bare)
    for k, v in raw.items():
        if k not in fields:
            key = ".".join(filter(None, (dotted(loc), str(k))))
            return f"{key}: unknown key; accepted keys here: {', '.join(fields)}"
        found = _unknown(v, fields[k], (*loc, k))
        if found:
            return found
    return None


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def _choices(tp) -> tuple:
    """The values of a Literal type (or of the Literal in a union with it)."""
    tp = _bare(tp)
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return next(filter(None, map(_choices, _union(tp))), ())


def _expected(tp) -> str:
    tp = _bare(tp)
    members = [_bare(a) for a in _union(tp)]
    if float in members:
        return "a number"  # int | float
    if is_section(tp):
        return "a mapping"
    return WRONG_TYPE.get(typing.get_origin(tp) or tp, "another type")


def _shown(tp) -> str:
    lo, hi, lo_open, hi_open = field_bounds(tp)
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"


def _union(tp) -> tuple:
    is_union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return typing.get_args(tp) if is_union else ()


def _bare(tp):
    """The type under Annotated[...] and `X | None`."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    args = [a for a in _union(tp) if a is not type(None)]
    if len(args) == 1:
        return _bare(args[0])
    return tp


def _metas(tp) -> list:
    """The Meta objects of a type, and of each member of a union (not of list items)."""
    if typing.get_origin(tp) is typing.Annotated:
        return [m for m in tp.__metadata__ if isinstance(m, msgspec.Meta)]
    return [m for a in _union(tp) for m in _metas(a)]
