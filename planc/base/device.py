"""Device names and the direct-I/O alignment: what the spec, the plan checks and the schedule share.

Kept apart from `planc.spec.model` (pydantic) so that reading a saved plan imports no spec machinery.
"""

from __future__ import annotations

import re

DIRECT_ALIGN = 4096  # O_DIRECT offsets, lengths and buffers are multiples of this
_DEVICE = re.compile(r"cuda(?::[0-9]{1,4})?")


def check_device(device: str) -> str:
    """`cuda` or `cuda:N`; anything else is refused here, before a load could fail on it."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ValueError(f"must be cuda or cuda:N (N a GPU index, e.g. cuda:0), got {brief(device)}")
    return device


def device_arg(device) -> str:
    """`device=` of a load: `cuda` or `cuda:N`, else a `SpecError` (`bad-device`) before anything is
    compiled or allocated."""
    from .codes import Code
    from .errors import SpecError

    try:
        return check_device(device)
    except ValueError as e:
        raise SpecError(f"device {e}", code=Code.BAD_DEVICE) from None


def brief(value, limit: int = 80) -> str:
    """repr() for messages: clipped, and safe for ints past the interpreter's str-conversion limit."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<{value.bit_length()}-bit integer>"
    try:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def index(device: str) -> int:
    """The GPU index of `cuda` or `cuda:N`."""
    return int(device.partition(":")[2] or 0)
