"""The plan reader's error vocabulary, shared by `planc.plan.check` and the formats' checks
(`planc.plan.formatcheck`): `_bad(path, problem)` names the field path and what is wrong with it
(the reader turns it into a `PlanFormatError`), `_shown(v)` puts a value of any size or nesting
into that line.
"""

from __future__ import annotations

import json

from ..base.errors import printable


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
