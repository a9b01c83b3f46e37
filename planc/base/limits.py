"""The limits a plan's figures are held to: one table, read by the spec's validation, the compiler
and the plan reader (`plancheck`), so that `compile` never writes a plan its own reader refuses.

A spec whose `io` or `dequantize` passes these compiles to fields the plan reader accepts; a
checkpoint tensor past them (more than `MAX_DIMS` dims, a dim past `MAX_DIM`) is refused by the
compiler (`check_shape`) with the rule and the tensor named, and by the manifest reader where no
tensor could be real (a dim past `MAX_DIM`).
"""

from __future__ import annotations

from .units import MAX_BYTES

MAX_DIMS = 16  # dims of one tensor
MAX_DIM = 2**62  # one dim (a zero-size tensor may say anything; no real dim is larger)
MAX_BLOCK = 1 << 20  # dequantize block edge
MAX_SLOT = 1 << 40  # io.slot: bytes of one ring slot
MAX_WORKERS = 256  # io.workers
MAX_SLOTS = 1024  # io.slots
MIN_MAP_WINDOW, MAX_MAP_WINDOW = 4096, 1 << 30  # io.map_window
MAX_MAP_LANES = 64  # io.map_lanes
MAX_TP = 1024  # tensor_parallel.size

__all__ = ["MAX_BYTES", "MAX_DIMS", "MAX_DIM", "MAX_BLOCK", "MAX_SLOT", "MAX_WORKERS", "MAX_SLOTS", "MIN_MAP_WINDOW",
           "MAX_MAP_WINDOW", "MAX_MAP_LANES", "MAX_TP", "shape_problem"]


def shape_problem(shape) -> str | None:
    """Why a shape cannot be a plan's (too many dims, a dim too large), or None."""
    if len(shape) > MAX_DIMS:
        return f"has {len(shape)} dims, a plan holds at most {MAX_DIMS}"
    big = next((d for d in shape if d > MAX_DIM), None)
    if big is not None:
        return f"has a dim of {big:,}, more than 2**62"
    return None
