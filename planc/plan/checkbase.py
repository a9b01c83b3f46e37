"""The plan reader's error vocabulary, shared by `planc.plan.check`, the record fields' checks
(`planc.plan.fieldcheck`) and the formats' checks (`planc.plan.formatcheck`): `_bad(path, problem)`
names the field path and what is wrong with it (the reader turns it into a `PlanFormatError`),
`_shown(v)` puts a value of any size or nesting into that line, and the checks of one value of a
kind (`_int`, `_str`, `_list`, `_one_of`, `_dtype`, `_shape`, `_addend`) raise it.
"""

from __future__ import annotations

import json
import math
import struct

from ..base.dtypes import DTYPES
from ..base.errors import printable
from ..base.limits import MAX_DIM, MAX_DIMS

_INTS = {int}


class _Bad(Exception):
    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem


def _bad(path: str, problem: str) -> _Bad:
    return _Bad(path, problem)


def _shown(v) -> str:
    """`v` for an error line: at most 60 characters, whatever its size or nesting (a value nested a
    thousand deep is not handed to a recursive encoder: `_compact` stops at `_SHOWN_DEPTH`)."""
    s = printable(repr(v) if type(v) is str else _compact(v, 0, [60]))
    return s if len(s) <= 60 else s[:57] + "..."


_SHOWN_DEPTH = 8


def _compact(v, depth: int, room: list) -> str:
    """JSON text of `v`, cut short ("...") past `_SHOWN_DEPTH` levels or once `room[0]` characters are spent."""
    if room[0] <= 0:
        return "..."
    if type(v) in (list, dict):
        if depth >= _SHOWN_DEPTH:
            text = "[...]" if type(v) is list else "{...}"
        else:
            items = []
            for x in (v if type(v) is list else v.items()):
                if room[0] <= 0:
                    items.append("...")
                    break
                items.append(_compact(x, depth + 1, room) if type(v) is list else
                             f"{_scalar(x[0])}: {_compact(x[1], depth + 1, room)}")
            text = ("[%s]" if type(v) is list else "{%s}") % ", ".join(items)
    else:
        text = _scalar(v)
    room[0] -= len(text)
    return text


def _scalar(v) -> str:
    try:
        return json.dumps(v)
    except (TypeError, ValueError):  # not a JSON value (a Plan field of a caller's own making)
        return type(v).__name__


def _int(v, path: str, lo: int = 0, hi: int | None = None) -> int:
    if type(v) is not int:
        raise _bad(path, f"must be an integer, got {_shown(v)}")
    if v < lo or (hi is not None and v > hi):
        rng = f"at least {lo:,}" if hi is None else f"between {lo:,} and {hi:,}"
        raise _bad(path, f"must be {rng}, got {v:,}")
    return v


def _str(v, path: str) -> str:
    if type(v) is not str:
        raise _bad(path, f"must be a string, got {_shown(v)}")
    return v


def _list(v, path: str, n: int | None = None) -> list:
    if type(v) is not list:
        raise _bad(path, f"must be an array, got {_shown(v)}")
    if n is not None and len(v) != n:
        raise _bad(path, f"must have {n} fields, got {len(v)}")
    return v


def _addend(v, path: str) -> float:
    """A part's or kernel's `add`: a finite float that float32 holds exactly (what a kernel adds)."""
    if type(v) is not float or not math.isfinite(v):
        raise _bad(path, f"must be a finite number, got {_shown(v)}")
    try:
        held = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        held = None
    if held != v:
        raise _bad(path, f"{_shown(v)} is not a float32 value")
    return v


def _one_of(v, path: str, allowed) -> str:
    if v not in allowed or type(v) is not str:
        raise _bad(path, f"must be one of {', '.join(allowed)}, got {_shown(v)}")
    return v


def _dtype(v, path: str) -> str:
    if type(v) is not str or v not in DTYPES:
        raise _bad(path, f"unknown dtype {_shown(v)}")
    return v


def _shape(v, path: str) -> tuple[int, ...]:
    if type(v) is list and len(v) <= MAX_DIMS and (not v or (set(map(type, v)) == _INTS and min(v) >= 0
                                                       and max(v) <= MAX_DIM)):
        return tuple(v)
    _list(v, path)
    if len(v) > MAX_DIMS:
        raise _bad(path, f"has {len(v)} dims, at most {MAX_DIMS}")
    return tuple(_int(d, f"{path}[{k}]", 0, MAX_DIM) for k, d in enumerate(v))
