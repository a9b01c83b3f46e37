"""Scatter kernel: one staged request -> many arena places, in one launch.

A request whose bytes belong to many small tensors (an MoE layer's experts, stacked by expert)
is copied whole into a device staging slot, then this kernel moves each segment to its place.
The segment table (source offset in the slot, destination offset in the arena, length; all in
units of the request's element width) is uploaded once for the whole plan.

Each block takes whole segments (grid-stride over segments); its threads stride over the
segment's elements, so a segment's reads and writes are coalesced.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from . import launch as driver_launch
from .kernels import CACHE
from .seam import simulated

_THREADS = 256
_SIM_THREADS = 32


@cuda.jit(cache=CACHE)
def _scatter(src, dst, table, first, last):
    seg = first + cuda.blockIdx.x
    while seg < last:
        s0 = table[seg, 0]
        d0 = table[seg, 1]
        n = table[seg, 2]
        i = cuda.threadIdx.x
        while i < n:
            dst[d0 + i] = src[s0 + i]
            i += cuda.blockDim.x
        seg += cuda.gridDim.x


_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def build_table(plan) -> tuple[np.ndarray, dict]:
    """All scattered requests' segments, in element units: (table int64 [n, 3], {(run, req): (first, last)})."""
    rows, where = [], {}
    for r in plan.runs:
        for qi, q in enumerate(r.requests):
            if not q.scatter:
                continue
            w = q.width
            first = len(rows)
            for slot_off, _space, dst, n, _rows, _pitch in q.copies:
                rows.append((slot_off // w, dst // w, n // w))
            where[(r.index, qi)] = (first, len(rows))
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return table, where


def launch(staging_u8, arena_u8, table_dev, first: int, last: int, width: int, stream) -> None:
    if last <= first:
        return
    # A view in wider elements needs a whole number of them: the arena's size need not be one, but every
    # scattered copy lies in its width-aligned prefix (the plan codec checks offsets and lengths).
    src = staging_u8[:len(staging_u8) // width * width].view(_VIEW[width])
    dst = arena_u8[:len(arena_u8) // width * width].view(_VIEW[width])
    nseg = last - first
    if simulated():
        blocks, threads = min(2, nseg), _SIM_THREADS
    else:
        blocks, threads = min(nseg, 65535), _THREADS
    driver_launch.go(_scatter, f"scatter_{width}", blocks, threads, stream, src, dst, table_dev, first, last)


@cuda.jit(cache=CACHE)
def _zero(dst, n):
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < n:
        dst[i] = 0
        i += s


# Stable names of the kernels, as planc.execute.signatures lists their launches.
KERNELS = {**{f"scatter_{w}": _scatter for w in _VIEW}, "zero": _zero}


def zero(arena_u8, regions, stream) -> int:
    """Zero-fill (offset, bytes) regions of the arena: the padding of uneven tensor-parallel splits.
    Returns the kernels launched (one per non-empty region)."""
    launched = 0
    for off, n in regions:
        if n <= 0:
            continue
        blocks, threads = (2, _SIM_THREADS) if simulated() else (min(1024, -(-n // _THREADS)), _THREADS)
        driver_launch.go(_zero, "zero", blocks, threads, stream, arena_u8[off:off + n], n)
        launched += 1
    return launched
