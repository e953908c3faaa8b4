"""pydantic's ValidationError as the one line a user reads.

`one_line` picks one error (an unknown key first) and says it as
`<dotted key>: <what is wrong>; <what is accepted>`, e.g.
`train.epochs: 0 is out of range; accepted: [1, 10000]`. The sections' own
rules raise `Rule`, whose text names its keys relative to the section.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo

UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden", "invalid_key")
WRONG_TYPE = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a non-empty string", "string_too_short": "a non-empty string",
    "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
    "dataclass_exact_type": "a mapping",
}
OUT_OF_RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


class Rule(ValueError):
    """A rule across keys of one section broke. In its text `{path}` stands for
    the dotted key the validator checks and `{p}` for the section's prefix
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


def field_info(root: type, loc: list | tuple):
    """The pydantic FieldInfo (or, past a list index, the item's type) at `loc`."""
    cls, info = root, None
    for part in loc:
        if isinstance(part, int):  # into a list: its item type, Annotated bounds kept
            info = typing.get_args(_type_of(info))[0]
            cls = _bare(info)
            continue
        fields = getattr(cls, "__pydantic_fields__", None)
        if fields is None or part not in fields:
            return None
        info = fields[part]
        cls = _type_of(info)
    return info


def field_bounds(info) -> tuple[Any, Any, bool, bool]:
    """(low, high, low_open, high_open) of a field's Field(ge/gt/le/lt) bounds."""
    lo = hi = None
    lo_open = hi_open = False
    for m in _metadata(info):
        for attr, is_lo, is_open in (("ge", True, False), ("gt", True, True),
                                     ("le", False, False), ("lt", False, True)):
            value = getattr(m, attr, None)
            if value is None:
                continue
            if is_lo:
                lo, lo_open = value, is_open
            else:
                hi, hi_open = value, is_open
    return lo, hi, lo_open, hi_open


def one_line(exc: ValidationError, root: type) -> str:
    """The first error of `exc` (validating `root`), unknown keys first, on one line."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] in UNKNOWN), errors[0])
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    key = dotted(loc) or "params"
    if kind in UNKNOWN:
        key = ".".join(filter(None, (dotted(loc[:-1]), str(loc[-1]))))
        cls = _type_of(field_info(root, loc[:-1])) if loc[:-1] else root
        accepted = ", ".join(getattr(cls, "__pydantic_fields__", {}))
        return f"{key}: unknown key; accepted keys here: {accepted}"
    if kind == "value_error" and isinstance(err.get("ctx", {}).get("error"), Rule):
        section = loc[:-1] if _is_field(root, loc) else loc
        return err["ctx"]["error"].render(dotted(loc), dotted(section))
    if kind in WRONG_TYPE:
        return f"{key}: expected {WRONG_TYPE[kind]}, got {value!r}"
    if kind in OUT_OF_RANGE:
        return f"{key}: {value!r} is out of range; accepted: {_shown(field_info(root, loc))}"
    if kind == "literal_error":
        return _not_a_choice(root, loc, value)
    if kind == "too_short":
        return f"{key}: empty choice list; give at least one value"
    return f"{key}: {err['msg']}, got {value!r}"


# ------------------------------------------------------------------ helpers

def _not_a_choice(root: type, loc: tuple, value) -> str:
    in_list = bool(loc) and isinstance(loc[-1], int)
    field_loc = loc[:-1] if in_list else loc
    info = field_info(root, field_loc)
    choices = _literal_args(_annotation(info))
    some = "some" if in_list else "one"
    return (f"{dotted(field_loc)}: {value!r} is not accepted; "
            f"use {some} of {', '.join(map(repr, choices))}")


def _literal_args(tp) -> tuple:
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    for arg in typing.get_args(tp):
        found = _literal_args(arg)
        if found:
            return found
    return ()


def _shown(info) -> str:
    lo, hi, lo_open, hi_open = field_bounds(info)
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"


def _is_field(root: type, loc: tuple) -> bool:
    """Whether `loc` ends at a plain field (a field validator) rather than a section."""
    info = field_info(root, loc) if loc else None
    return info is not None and not hasattr(_type_of(info), "__pydantic_fields__")


def _annotation(info):
    """The declared type at a FieldInfo, or the item type itself past a list index."""
    return info.annotation if isinstance(info, FieldInfo) else info


def _type_of(info):
    return _bare(_annotation(info))


def _bare(tp):
    """The type under Annotated[...] and `X | None`."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp) and len(args) == 1:
        return _bare(args[0])
    return tp


def _metadata(info) -> list:
    """Bound objects of a FieldInfo, or of an Annotated item type."""
    if isinstance(info, FieldInfo):
        found = list(info.metadata)
    elif typing.get_origin(info) is typing.Annotated:
        found = list(info.__metadata__)
    else:
        return []
    nested = [m for f in found if hasattr(f, "metadata") for m in f.metadata]
    return found + nested
