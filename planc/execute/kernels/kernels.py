"""Grid-stride Numba CUDA kernels on raw bit patterns.

Every kernel reads and writes device arrays viewed as uint8, uint16 or uint32 and produces
exactly the bits of the host reference in `planc.execute.kernels.refconv`:

* float32 -> BF16 and float32 -> F16 round to nearest, ties to even; overflow gives infinity;
  subnormals are kept. A NaN stays a NaN of the same sign: BF16 gets ml_dtypes' quiet NaN
  0x7FC0, F16 keeps the top ten payload bits as numpy's portable routine does.
* BF16 -> float32 and F16 -> float32 are exact (subnormals, infinities and NaN payloads too).
* BF16 <-> F16 go through float32; they may run in place (source and destination the same
  uint16 buffer): each element is read and then written by one thread.
* FP8 (E4M3 / E5M2) block dequantization: float32(fp8) * float32 scale, rounded once to BF16,
  F16, or kept as float32. FP8 decodes through a 256-entry float32 table built from ml_dtypes.
* 2-D transpose of 1-, 2-, 4- and 8-byte elements through a shared-memory tile.

Integer work happens in int64 on purpose: numba widens integer arithmetic to 64 bits on the
GPU while the simulator keeps numpy's widths (there `uint16 << 16` is 0), so each value is
cast to int64 when read and truncated back when stored; both then compute the same bits.

This module holds the kernels' source alone (it is what the shipped PTX is built from, and what
the simulator runs); their launchers, which check sizes and alignment, pick the launch geometry and
name each launch, are in `planc.execute.kernels.dispatch` and import no numba. `KERNELS` names every kernel.
"""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda's kernel compiler still calls numpy.row_stack (gone in numpy 2.5)
    np.row_stack = np.vstack

import numba  # noqa: E402
from numba import cuda  # noqa: E402

from planc.base import settings

_TILE = 32  # transpose tile edge
_TILE_PAD = 33  # padded row of the shared tile (no bank conflicts on the column read)

# A small tensor gets a small grid on purpose; numba would warn about occupancy at each launch.
warnings.filterwarnings(
    "ignore", message=r".*Grid size \d+ will likely result in GPU under-utilization"
)



def _cache_writable() -> bool:
    """numba's on-disk kernel cache needs a writable folder: beside this file, NUMBA_CACHE_DIR, or ~/.cache.

    With the cache, a process after the first loads each kernel's compiled code from disk instead of
    compiling it again (about 0.5-1 s per kernel). Without a writable folder, kernels compile per process.
    """
    if not settings.numba_cache():
        return False
    places = [os.environ.get("NUMBA_CACHE_DIR"), os.path.join(os.path.dirname(__file__), "__pycache__"),
              os.path.join(os.path.expanduser("~"), ".cache")]
    for d in places:
        if not d:
            continue
        probe = d if os.path.isdir(d) else os.path.dirname(d)
        if os.path.isdir(probe) and os.access(probe, os.W_OK):
            return True
    return False


CACHE = _cache_writable()


# --------------------------------------------------------------------------------------------
# Scalar bit operations. Each takes and returns an int64 holding an unsigned bit pattern.
# Built by a factory so the same source compiles as CUDA device functions and, for checks
# of numba's integer typing on a machine without a GPU, as CPU functions (`numba.njit`).


def _scalar_ops(jit) -> SimpleNamespace:
    @jit
    def identity(x):
        return x

    @jit
    def f32_to_bf16(x):
        if (x & 0x7FFFFFFF) > 0x7F800000:
            return ((x >> 16) & 0x8000) | 0x7FC0
        return (x + 0x7FFF + ((x >> 16) & 1)) >> 16

    @jit
    def f32_to_f16(x):
        sign = (x >> 16) & 0x8000
        a = x & 0x7FFFFFFF
        if a > 0x7F800000:
            m = (a & 0x7FFFFF) >> 13
            if m == 0:
                m = 1
            return sign | 0x7C00 | m
        e = a >> 23
        if e >= 143:  # |x| >= 2**16, infinity included
            return sign | 0x7C00
        if e >= 113:  # normal in F16: rebias the exponent, round away 13 bits
            b = a - 0x38000000
            r = b >> 13
            rem = b & 0x1FFF
            if rem > 0x1000 or (rem == 0x1000 and (r & 1) == 1):
                r += 1  # a carry into the exponent is correct, up to infinity
            return sign | r
        if e < 102:  # |x| < 2**-25 rounds to zero (2**-25 itself ties to zero)
            return sign
        m = (a & 0x7FFFFF) | 0x800000
        sh = 126 - e  # 14..24
        r = m >> sh
        rem = m & ((1 << sh) - 1)
        half = 1 << (sh - 1)
        if rem > half or (rem == half and (r & 1) == 1):
            r += 1  # may reach 0x400, the smallest normal: correct
        return sign | r

    @jit
    def bf16_to_f32(h):
        return h << 16

    @jit
    def f16_to_f32(h):
        sign = (h & 0x8000) << 16
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        if e == 0x1F:
            return sign | 0x7F800000 | (m << 13)
        if e != 0:
            return sign | ((e + 112) << 23) | (m << 13)
        if m == 0:
            return sign
        e = 113
        while (m & 0x400) == 0:
            m <<= 1
            e -= 1
        return sign | (e << 23) | ((m & 0x3FF) << 13)

    @jit
    def bf16_to_f16(h):
        return f32_to_f16(h << 16)

    @jit
    def f16_to_bf16(h):
        return f32_to_bf16(f16_to_f32(h))

    return SimpleNamespace(
        identity=identity,
        f32_to_bf16=f32_to_bf16,
        f32_to_f16=f32_to_f16,
        bf16_to_f32=bf16_to_f32,
        f16_to_f32=f16_to_f32,
        bf16_to_f16=bf16_to_f16,
        f16_to_bf16=f16_to_bf16,
    )


_ops = _scalar_ops(cuda.jit(device=True))


# --------------------------------------------------------------------------------------------
# Kernels


def _map_kernel(fn):
    """dst[i] = fn(src[i]) for i < n, grid-stride."""

    @cuda.jit(cache=CACHE)
    def kernel(src, dst, n):
        i = cuda.grid(1)
        s = cuda.gridsize(1)
        # Four loads in flight before the four stores; in place is still safe, since each
        # element is read and written by this thread alone.
        while i + 3 * s < n:
            a0 = np.int64(src[i])
            a1 = np.int64(src[i + s])
            a2 = np.int64(src[i + 2 * s])
            a3 = np.int64(src[i + 3 * s])
            dst[i] = fn(a0)
            dst[i + s] = fn(a1)
            dst[i + 2 * s] = fn(a2)
            dst[i + 3 * s] = fn(a3)
            i += 4 * s
        while i < n:
            dst[i] = fn(np.int64(src[i]))
            i += s

    return kernel


def _add_kernel(to_f32, out_bits):
    """dst[i] = out_bits(float32(src[i]) + add) for i < n, grid-stride: `add` comes as its float32 bits
    (an integer argument); the sum is rounded once, then once more to the output type. A NaN stays
    the NaN it was, made quiet (`planc.execute.kernels.refconv.add_f32`, whose bits these are)."""

    @cuda.jit(cache=CACHE)
    def kernel(src, dst, n, add_bits):
        a = np.uint32(add_bits).view(np.float32)
        i = cuda.grid(1)
        s = cuda.gridsize(1)
        while i < n:
            b = np.int64(to_f32(np.int64(src[i]))) & 0xFFFFFFFF
            if (b & 0x7FFFFFFF) > 0x7F800000:
                r = b | 0x400000
            else:
                r = np.int64((np.uint32(b).view(np.float32) + a).view(np.uint32))
            dst[i] = out_bits(r)
            i += s

    return kernel


def _dequant_kernel(fn):
    """out[r, c] = fn(bits(float32(table[w[r, c]] * scale[r // B, c // B]))), 2-D grid-stride.

    x runs along columns (coalesced); each y index takes four consecutive rows at a time, so
    that four loads are in flight per thread. Block indices are stepped along with rows and
    columns instead of divided out for each element.
    """

    @cuda.jit(cache=CACHE)
    def kernel(w, scale, table, out, rows, cols, block, scols):
        x0, y0 = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        step_b = sx // block
        step_o = sx - step_b * block
        first_b = x0 // block
        first_o = x0 - first_b * block
        r = 4 * y0
        rstep = 4 * sy
        step_rb = rstep // block
        step_ro = rstep - step_rb * block
        rb = r // block
        ro = r - rb * block
        while r < rows:
            # scale-row offsets of rows r, r + 1, r + 2, r + 3
            b1 = rb
            o1 = ro + 1
            if o1 >= block:
                o1 -= block
                b1 += 1
            b2 = b1
            o2 = o1 + 1
            if o2 >= block:
                o2 -= block
                b2 += 1
            b3 = b2
            if o2 + 1 >= block:
                b3 += 1
            s0 = rb * scols
            s1 = b1 * scols
            s2 = b2 * scols
            s3 = b3 * scols
            base = r * cols
            full = r + 3 < rows
            c = x0
            cb = first_b
            co = first_o
            while c < cols:
                i = base + c
                if full:
                    q0 = w[i]
                    q1 = w[i + cols]
                    q2 = w[i + 2 * cols]
                    q3 = w[i + 3 * cols]
                    v0 = np.float32(table[q0] * scale[s0 + cb])
                    v1 = np.float32(table[q1] * scale[s1 + cb])
                    v2 = np.float32(table[q2] * scale[s2 + cb])
                    v3 = np.float32(table[q3] * scale[s3 + cb])
                    out[i] = fn(np.int64(v0.view(np.uint32)))
                    out[i + cols] = fn(np.int64(v1.view(np.uint32)))
                    out[i + 2 * cols] = fn(np.int64(v2.view(np.uint32)))
                    out[i + 3 * cols] = fn(np.int64(v3.view(np.uint32)))
                else:
                    k = 0
                    while r + k < rows:
                        sk = s0 if k == 0 else (s1 if k == 1 else s2)
                        v = np.float32(table[w[i + k * cols]] * scale[sk + cb])
                        out[i + k * cols] = fn(np.int64(v.view(np.uint32)))
                        k += 1
                c += sx
                cb += step_b
                co += step_o
                if co >= block:
                    co -= block
                    cb += 1
            r += rstep
            rb += step_rb
            ro += step_ro
            if ro >= block:
                ro -= block
                rb += 1

    return kernel


def _transpose_kernel(nbtype):
    """dst[c, r] = src[r, c] through a padded 32 x 33 shared tile; tiles are grid-strided."""

    @cuda.jit(cache=CACHE)
    def kernel(src, dst, rows, cols):
        tile = cuda.shared.array((_TILE, _TILE_PAD), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        by = cuda.blockDim.y
        tr = cuda.blockIdx.y
        while tr * _TILE < rows:
            r0 = tr * _TILE
            tc = cuda.blockIdx.x
            while tc * _TILE < cols:
                c0 = tc * _TILE
                c = c0 + tx
                j = ty
                while j < _TILE:
                    r = r0 + j
                    if r < rows and c < cols:
                        tile[j, tx] = src[r * cols + c]
                    j += by
                cuda.syncthreads()
                r = r0 + tx
                j = ty
                while j < _TILE:
                    c = c0 + j
                    if c < cols and r < rows:
                        dst[c * rows + r] = tile[tx, j]
                    j += by
                cuda.syncthreads()
                tc += cuda.gridDim.x
            tr += cuda.gridDim.y

    return kernel


_k_copy = _map_kernel(_ops.identity)
_k_f32_to_bf16 = _map_kernel(_ops.f32_to_bf16)
_k_f32_to_f16 = _map_kernel(_ops.f32_to_f16)
_k_bf16_to_f32 = _map_kernel(_ops.bf16_to_f32)
_k_f16_to_f32 = _map_kernel(_ops.f16_to_f32)
_k_bf16_to_f16 = _map_kernel(_ops.bf16_to_f16)
_k_f16_to_bf16 = _map_kernel(_ops.f16_to_bf16)

_TO_F32 = {"F32": _ops.identity, "F16": _ops.f16_to_f32, "BF16": _ops.bf16_to_f32}
_FROM_F32 = {"F32": _ops.identity, "F16": _ops.f32_to_f16, "BF16": _ops.f32_to_bf16}
_k_add = {(a, b): _add_kernel(_TO_F32[a], _FROM_F32[b]) for a in _TO_F32 for b in _FROM_F32}

_k_dequant = {
    "BF16": _dequant_kernel(_ops.f32_to_bf16),
    "F16": _dequant_kernel(_ops.f32_to_f16),
    "F32": _dequant_kernel(_ops.identity),
}

_k_transpose = {
    1: _transpose_kernel(numba.uint8),
    2: _transpose_kernel(numba.uint16),
    4: _transpose_kernel(numba.uint32),
    8: _transpose_kernel(numba.uint64),
}

# Stable names of the kernels: the shipped PTX (planc.execute.kernels.signatures) and the on-disk cubins of
# planc.execute.device.launch are keyed by them.
KERNELS = {
    "copy": _k_copy,
    "f32_to_bf16": _k_f32_to_bf16,
    "f32_to_f16": _k_f32_to_f16,
    "bf16_to_f32": _k_bf16_to_f32,
    "f16_to_f32": _k_f16_to_f32,
    "bf16_to_f16": _k_bf16_to_f16,
    "f16_to_bf16": _k_f16_to_bf16,
    **{f"dequant_{d}": k for d, k in _k_dequant.items()},
    **{f"transpose_{s}": k for s, k in _k_transpose.items()},
    **{f"add_{a.lower()}_{b.lower()}": k for (a, b), k in _k_add.items()},
}
