"""Numba CUDA kernels that dequantize MXFP4 and NVFP4 -> BF16, F16 or F32, as stored or with the
last two dims swapped.

Input: the packed E2M1 bytes (uint8, two values a byte, the low nibble first) and the block scales
(uint8: E8M0 bytes for MXFP4, F8_E4M3 bytes for NVFP4), as they lie in the landing region; for
NVFP4 also the 256-entry float32 E4M3 decode table and the per-tensor float32 scale (a one-element
array). Output: `batch` matrices of [rows, cols] values (or [cols, rows] transposed), as bits
(uint32 for F32, uint16 for F16 and BF16). The bits are those of the reference,
`planc.execute.kernels.fp4ref`:

* MXFP4: e2m1 x 2^(s - 127) is built from bits alone (the exponents added, a subnormal result
  shifted, exact because E2M1 has one mantissa bit; past float32's range: infinity), s = 255 the
  positive quiet NaN; then rounded to the target by `planc.execute.kernels.kernels`' bit operations.
* NVFP4: float32(e4m3) x scale_2, rounded once, then x e2m1, rounded once (two multiplies: there is
  no add for the compiler to fuse them into); a NaN result becomes the positive quiet NaN.

Value v of a flat tensor (batch, row, col in order) is the nibble v % 2 of byte v // 2, its scale
the byte v // 32 (MXFP4) or v // 16 (NVFP4): cols is a whole number of blocks, so rows never share
a scale. The plain kernels stride over bytes (one byte, two values, per step); the transposing
ones go through a shared tile of 32 rows x 64 values, so both the byte reads along a row and the
writes along a column of the output are coalesced. The tiles of every batch member are
grid-strided along y, the column tiles along x.

This module is the kernels' source (the shipped PTX is built from it); the launcher, which checks
sizes and picks the geometry, is `planc.execute.kernels.fp4_dispatch` and imports no numba.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from .kernels import CACHE, _ops

TILE_ROWS = 32  # rows of the transposing tile (one per thread along x on the way out)
TILE_BYTES = 32  # bytes of a tile row: 64 values (one byte per thread along x on the way in)
_TILE_VALUES = 2 * TILE_BYTES
_TILE_PAD = _TILE_VALUES + 1  # an odd row length: the column reads hit 32 banks
_QNAN = 0x7FC00000


@cuda.jit(device=True)
def _e2m1_bits(n):
    """float32 bits of the E2M1 nibble n (int64 0..15)."""
    sign = (n & 8) << 28
    mag = n & 7
    if mag == 0:
        return sign
    if mag == 1:
        return sign | 0x3F000000  # 0.5
    return sign | ((126 + (mag >> 1)) << 23) | ((mag & 1) << 22)


@cuda.jit(device=True)
def _mx_bits(n, s):
    """float32 bits of e2m1(n) x 2^(s - 127): s = 255 is NaN; exact, or infinite past the range."""
    if s == 255:
        return _QNAN
    sign = (n & 8) << 28
    mag = n & 7
    if mag == 0:
        return sign
    e0 = 126
    m0 = 0
    if mag >= 2:
        e0 = 126 + (mag >> 1)
        m0 = (mag & 1) << 22
    e = e0 + s - 127
    if e >= 255:
        return sign | 0x7F800000
    if e >= 1:
        return sign | (e << 23) | m0
    return sign | ((0x800000 | m0) >> (1 - e))  # a subnormal: at most two places, no bit lost


@cuda.jit(device=True)
def _nv_bits(n, bs):
    """float32 bits of e2m1(n) x bs (bs: the block's float32 scale), a NaN the positive quiet one."""
    v = np.float32(np.uint32(_e2m1_bits(n)).view(np.float32) * bs)
    if v != v:
        return _QNAN
    return np.int64(v.view(np.uint32))


def _mx_plain(out_bits):
    @cuda.jit(cache=CACHE)
    def kernel(w, s, out, batch, rows, cols):
        nbytes = batch * rows * cols // 2
        j = cuda.grid(1)
        step = cuda.gridsize(1)
        while j < nbytes:
            b = np.int64(w[j])
            sc = np.int64(s[j // 16])
            out[2 * j] = out_bits(_mx_bits(b & 15, sc))
            out[2 * j + 1] = out_bits(_mx_bits(b >> 4, sc))
            j += step

    return kernel


def _nv_plain(out_bits):
    @cuda.jit(cache=CACHE)
    def kernel(w, s, table, s2, out, batch, rows, cols):
        nbytes = batch * rows * cols // 2
        t2 = s2[0]
        j = cuda.grid(1)
        step = cuda.gridsize(1)
        while j < nbytes:
            b = np.int64(w[j])
            bs = np.float32(table[s[j // 8]] * t2)
            out[2 * j] = out_bits(_nv_bits(b & 15, bs))
            out[2 * j + 1] = out_bits(_nv_bits(b >> 4, bs))
            j += step

    return kernel


def _mx_transposed(out_bits, nbtype):
    @cuda.jit(cache=CACHE)
    def kernel(w, s, out, batch, rows, cols):
        tile = cuda.shared.array((TILE_ROWS, _TILE_PAD), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        by = cuda.blockDim.y
        half = cols // 2
        row_tiles = (rows + TILE_ROWS - 1) // TILE_ROWS
        ty_tile = cuda.blockIdx.y
        while ty_tile < batch * row_tiles:
            m = ty_tile // row_tiles
            r0 = (ty_tile - m * row_tiles) * TILE_ROWS
            src0 = m * rows * half
            dst0 = m * rows * cols
            tc = cuda.blockIdx.x
            while tc * _TILE_VALUES < cols:
                c0 = tc * _TILE_VALUES
                k = c0 // 2 + tx  # the byte column this thread reads
                j = ty
                while j < TILE_ROWS:
                    r = r0 + j
                    if r < rows and k < half:
                        at = src0 + r * half + k
                        b = np.int64(w[at])
                        sc = np.int64(s[at // 16])
                        tile[j, 2 * tx] = out_bits(_mx_bits(b & 15, sc))
                        tile[j, 2 * tx + 1] = out_bits(_mx_bits(b >> 4, sc))
                    j += by
                cuda.syncthreads()
                r = r0 + tx
                j = ty
                while j < _TILE_VALUES:
                    c = c0 + j
                    if c < cols and r < rows:
                        out[dst0 + c * rows + r] = tile[tx, j]
                    j += by
                cuda.syncthreads()
                tc += cuda.gridDim.x
            ty_tile += cuda.gridDim.y

    return kernel


def _nv_transposed(out_bits, nbtype):
    @cuda.jit(cache=CACHE)
    def kernel(w, s, table, s2, out, batch, rows, cols):
        tile = cuda.shared.array((TILE_ROWS, _TILE_PAD), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        by = cuda.blockDim.y
        t2 = s2[0]
        half = cols // 2
        row_tiles = (rows + TILE_ROWS - 1) // TILE_ROWS
        ty_tile = cuda.blockIdx.y
        while ty_tile < batch * row_tiles:
            m = ty_tile // row_tiles
            r0 = (ty_tile - m * row_tiles) * TILE_ROWS
            src0 = m * rows * half
            dst0 = m * rows * cols
            tc = cuda.blockIdx.x
            while tc * _TILE_VALUES < cols:
                c0 = tc * _TILE_VALUES
                k = c0 // 2 + tx
                j = ty
                while j < TILE_ROWS:
                    r = r0 + j
                    if r < rows and k < half:
                        at = src0 + r * half + k
                        b = np.int64(w[at])
                        bs = np.float32(table[s[at // 8]] * t2)
                        tile[j, 2 * tx] = out_bits(_nv_bits(b & 15, bs))
                        tile[j, 2 * tx + 1] = out_bits(_nv_bits(b >> 4, bs))
                    j += by
                cuda.syncthreads()
                r = r0 + tx
                j = ty
                while j < _TILE_VALUES:
                    c = c0 + j
                    if c < cols and r < rows:
                        out[dst0 + c * rows + r] = tile[tx, j]
                    j += by
                cuda.syncthreads()
                tc += cuda.gridDim.x
            ty_tile += cuda.gridDim.y

    return kernel


_BITS = {"BF16": _ops.f32_to_bf16, "F16": _ops.f32_to_f16, "F32": _ops.identity}
_TILE_TYPE = {"BF16": numba.uint16, "F16": numba.uint16, "F32": numba.uint32}

# Stable names: "{format}_{target}" as stored, "{format}t_{target}" with the last two dims swapped.
KERNELS = {}
for _o, _fn in _BITS.items():
    KERNELS[f"mxfp4_{_o}"] = _mx_plain(_fn)
    KERNELS[f"nvfp4_{_o}"] = _nv_plain(_fn)
    KERNELS[f"mxfp4t_{_o}"] = _mx_transposed(_fn, _TILE_TYPE[_o])
    KERNELS[f"nvfp4t_{_o}"] = _nv_transposed(_fn, _TILE_TYPE[_o])

__all__ = ["KERNELS", "TILE_ROWS", "TILE_BYTES"]
