"""Numbers from text: byte sizes (`64MiB`, `8GiB`, `1.5GB`, `4096`, one parser and one formatter) and
ASCII integers (`ascii_int`)."""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
MAX_BYTES = 2**62  # what a plan's figures may be (plancheck: beyond it no byte count is a real one), with room
# for their sums in int64 fields
_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value) -> int:
    """Parse a byte size; raises ValueError quoting the input on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size like 64MiB, 8GiB, 1.5GB or an integer, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative, got {_clip(value)}")
        return _bounded(value, value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return _bounded(int(value), value)
    if isinstance(value, str):
        m = _RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            if len(m.group(1)) > 40:  # past any byte count; Fraction would also refuse a few thousand digits
                raise ValueError(f"a byte size is at most 2**62 ({MAX_BYTES}), got {_clip(value)}")
            # Exact arithmetic: a float would lose digits past 2**53 and overflow to infinity.
            n = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]
            if n.denominator == 1:
                return _bounded(int(n), value)
            raise ValueError(f"byte size {value!r} is not a whole number of bytes")
    raise ValueError(f"expected a byte size like 64MiB, 8GiB, 1.5GB or an integer, got {_clip(value)}")


def _bounded(n: int, value) -> int:
    if n > MAX_BYTES:
        raise ValueError(f"a byte size is at most 2**62 ({MAX_BYTES}), got {_clip(value)}")
    return n


def _clip(value, limit: int = 60) -> str:
    """repr() for messages: short, and safe for ints past the interpreter's str-conversion limit."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"<{value.bit_length()}-bit integer>"
    text = repr(value) if isinstance(value, (int, float, str, type(None))) else _as_written(value, limit)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def fmt_bytes(n: int | None) -> str:
    """Human form with binary units: 1536 -> '1.50 KiB'."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{n} B"


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


SPEC_CAP = 16 * 2**20  # bytes; a spec is a page of rules, and a bigger file is refused before it is read


def ascii_int(text: str) -> int | None:
    """An integer written in ASCII digits (`int` also takes other scripts' digits and `_`), else None."""
    t = text.strip(" \t\n\r")
    body = t[1:] if t[:1] in "+-" else t
    if not body or not body.isascii() or not body.isdigit() or len(body) > 18:  # 18 digits: past any rank
        return None
    return int(t)


def _as_written(value, limit: int) -> str:
    """A YAML date, a list, a mapping, bytes, a numpy number: its type and its value in the spec's own
    notation (JSON flow style, ISO dates), not a Python repr."""
    import datetime
    import json
    import numbers

    kind = type(value).__name__
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, (datetime.date, datetime.time)):
        return f"{kind} {value.isoformat()}"
    if isinstance(value, (bytes, bytearray)):
        return f"binary data of {len(value)} bytes"

    def plain(v):
        if isinstance(v, (set, frozenset)):
            return sorted((plain(x) for x in v), key=str)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)

    return f"{kind} {json.dumps(plain(value), ensure_ascii=False)[:limit]}"
