"""Scatter kernel: one staged request -> many arena places, in one launch; and the zero-fill.

A request whose bytes belong to many small tensors (an MoE layer's experts, stacked by expert)
is copied whole into a device staging slot, then this kernel moves each segment to its place.
The segment table (source offset in the slot, destination offset in the arena, length; all in
units of the request's element width) is uploaded once for the whole plan.

The grid is 2-D: x strides over the segments, y splits each segment among `gridDim.y` blocks,
whose threads stride over its elements together (so a segment's reads and writes are coalesced,
and a request of a few large pieces still spreads over every multiprocessor).

This module is the kernels' source (the shipped PTX is built from it); the launchers are
`planc.execute.kernels.dispatch.scatter`, `zero` and `scatter_table`.
"""

from __future__ import annotations

from numba import cuda

from .kernels import CACHE


@cuda.jit(cache=CACHE)
def _scatter(src, dst, table, first, last):
    seg = first + cuda.blockIdx.x
    step = cuda.gridDim.y * cuda.blockDim.x
    while seg < last:
        s0 = table[seg, 0]
        d0 = table[seg, 1]
        n = table[seg, 2]
        i = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        while i < n:
            dst[d0 + i] = src[s0 + i]
            i += step
        seg += cuda.gridDim.x


@cuda.jit(cache=CACHE)
def _zero(dst, n):
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < n:
        dst[i] = 0
        i += s


# Stable names of the kernels, as planc.execute.kernels.signatures lists their launches.
KERNELS = {**{f"scatter_{w}": _scatter for w in (1, 2, 4, 8)}, "zero": _zero}
