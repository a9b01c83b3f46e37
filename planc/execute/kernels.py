"""Grid-stride Numba CUDA kernels on raw bit patterns.

Every kernel reads and writes device arrays viewed as uint8, uint16 or uint32 and produces
exactly the bits of the host reference in `planc.execute.refconv`:

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

The public entry points take flat uint8 device arrays (slices of a larger arena are fine) and
explicit sizes: `convert`, `dequantize_fp8` and `transpose2d`. The `launch_*` functions take
arrays already viewed with the element type of the kernel.

Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set before numba is imported; the kernel
tests set it) every simulated thread is a Python thread, so launches use one or two small
blocks and the grid-stride loops cover the rest.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import SimpleNamespace

import numba
import numpy as np
from numba import cuda

from planc import settings
from planc.dtypes import FLOAT_CONVERTIBLE, FP8_DEQUANTIZABLE
from planc.execute import launch
from planc.execute.refconv import fp8_table

# Launch geometry.
_THREADS_1D = 256  # threads per block on a GPU
_BLOCK_2D = (32, 8)  # dequantization and transpose blocks on a GPU (x along the contiguous axis)
_BLOCKS_PER_SM = 32  # grid cap: this many blocks per multiprocessor
_DEFAULT_SMS = 132  # H100 / H200, when the device cannot be asked
_SIM_THREADS_1D = 32
_SIM_BLOCKS_1D = 2
_SIM_BLOCK_DEQUANT = (8, 4)
_SIM_GRID_DEQUANT = (2, 1)
_SIM_BLOCK_TRANSPOSE = (32, 4)
_SIM_GRID_TRANSPOSE = (2, 2)

_TILE = 32  # transpose tile edge
_TILE_PAD = 33  # padded row of the shared tile (no bank conflicts on the column read)

# A small tensor gets a small grid on purpose; numba would warn about occupancy at each launch.
warnings.filterwarnings(
    "ignore", message=r".*Grid size \d+ will likely result in GPU under-utilization"
)

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def simulated() -> bool:
    """True when numba.cuda is the CUDA simulator."""
    return bool(numba.config.ENABLE_CUDASIM)


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

# Stable names of the kernels: the shipped PTX (planc.execute.signatures) and the on-disk cubins of
# planc.execute.launch are keyed by them.
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
}
_NAMES = {id(k): n for n, k in KERNELS.items() if not n.startswith(("dequant_", "transpose_"))}

# (src dtype, dst dtype) -> kernel; identical dtypes copy.
_CONVERT_KERNELS = {
    ("F32", "BF16"): _k_f32_to_bf16,
    ("F32", "F16"): _k_f32_to_f16,
    ("BF16", "F32"): _k_bf16_to_f32,
    ("F16", "F32"): _k_f16_to_f32,
    ("BF16", "F16"): _k_bf16_to_f16,
    ("F16", "BF16"): _k_f16_to_bf16,
    ("F32", "F32"): _k_copy,
    ("F16", "F16"): _k_copy,
    ("BF16", "BF16"): _k_copy,
}


# --------------------------------------------------------------------------------------------
# Launch geometry

_max_blocks_cache: list[int] = []


def _max_blocks() -> int:
    if not _max_blocks_cache:
        try:
            sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
        except Exception:
            sms = _DEFAULT_SMS
        _max_blocks_cache.append(max(1, sms) * _BLOCKS_PER_SM)
    return _max_blocks_cache[0]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_1d(n: int) -> tuple[int, int]:
    """(blocks, threads) for a 1-D grid-stride launch over n > 0 elements."""
    if simulated():
        return min(_SIM_BLOCKS_1D, _cdiv(n, _SIM_THREADS_1D)), _SIM_THREADS_1D
    return min(_cdiv(n, _THREADS_1D), _max_blocks()), _THREADS_1D


def grid_2d(rows: int, cols: int, per_block: tuple[int, int]) -> tuple[int, int]:
    """(grid x, grid y) covering [rows, cols] with per_block (columns, rows) a block, capped."""
    cap = _max_blocks()
    gx = min(_cdiv(cols, per_block[0]), cap)
    gy = min(_cdiv(rows, per_block[1]), max(1, cap // gx), 65535)
    return gx, gy


# --------------------------------------------------------------------------------------------
# Launchers: arrays already viewed with the kernel's element type.


def _launch_map(kernel, src, dst, n: int, stream=0) -> None:
    if n <= 0:
        return
    blocks, threads = grid_1d(n)
    launch.go(kernel, _NAMES[id(kernel)], blocks, threads, stream, src, dst, n)


def launch_f32_to_bf16(src_u32, dst_u16, n: int, stream=0) -> None:
    _launch_map(_k_f32_to_bf16, src_u32, dst_u16, n, stream)


def launch_f32_to_f16(src_u32, dst_u16, n: int, stream=0) -> None:
    _launch_map(_k_f32_to_f16, src_u32, dst_u16, n, stream)


def launch_bf16_to_f32(src_u16, dst_u32, n: int, stream=0) -> None:
    _launch_map(_k_bf16_to_f32, src_u16, dst_u32, n, stream)


def launch_f16_to_f32(src_u16, dst_u32, n: int, stream=0) -> None:
    _launch_map(_k_f16_to_f32, src_u16, dst_u32, n, stream)


def launch_bf16_to_f16(src_u16, dst_u16, n: int, stream=0) -> None:
    """May run in place (src_u16 and dst_u16 the same buffer)."""
    _launch_map(_k_bf16_to_f16, src_u16, dst_u16, n, stream)


def launch_f16_to_bf16(src_u16, dst_u16, n: int, stream=0) -> None:
    """May run in place (src_u16 and dst_u16 the same buffer)."""
    _launch_map(_k_f16_to_bf16, src_u16, dst_u16, n, stream)


def launch_copy(src, dst, n: int, stream=0) -> None:
    _launch_map(_k_copy, src, dst, n, stream)


def launch_dequant_fp8(
    w_u8, scale_f32, table_f32, out, out_dtype: str, rows: int, cols: int, block: int, stream=0
) -> None:
    """out: uint16 for BF16/F16, uint32 for F32; table_f32: the 256-entry decode table."""
    if rows <= 0 or cols <= 0:
        return
    if simulated():
        grid, threads = _SIM_GRID_DEQUANT, _SIM_BLOCK_DEQUANT
    else:
        threads = _BLOCK_2D
        grid = grid_2d(rows, cols, (_BLOCK_2D[0], _BLOCK_2D[1] * 4))  # 4 rows a thread
    scols = _cdiv(cols, block)
    launch.go(_k_dequant[out_dtype], f"dequant_{out_dtype}", grid, threads, stream,
              w_u8, scale_f32, table_f32, out, rows, cols, block, scols)


def launch_transpose(src, dst, rows: int, cols: int, stream=0) -> None:
    """src, dst: uint8, uint16, uint32 or uint64 arrays of rows * cols elements."""
    if rows <= 0 or cols <= 0:
        return
    if simulated():
        threads = _SIM_BLOCK_TRANSPOSE
        grid = (
            min(_SIM_GRID_TRANSPOSE[0], _cdiv(cols, _TILE)),
            min(_SIM_GRID_TRANSPOSE[1], _cdiv(rows, _TILE)),
        )
    else:
        threads = _BLOCK_2D
        grid = grid_2d(rows, cols, (_TILE, _TILE))
    size = np.dtype(src.dtype).itemsize
    launch.go(_k_transpose[size], f"transpose_{size}", grid, threads, stream, src, dst, rows, cols)


# --------------------------------------------------------------------------------------------
# FP8 decode tables, one device copy per (dtype, device), made on first use.

_tables: dict[tuple[str, int], object] = {}
_tables_lock = threading.Lock()


def fp8_device_table(fp8_dtype: str):
    """The device copy of the 256-entry float32 decode table of `fp8_dtype`."""
    try:
        dev = int(getattr(cuda.get_current_device(), "id", 0))
    except Exception:
        dev = 0
    key = (fp8_dtype, dev)
    with _tables_lock:
        table = _tables.get(key)
        if table is None:
            table = cuda.to_device(fp8_table(fp8_dtype))
            _tables[key] = table
    return table


# --------------------------------------------------------------------------------------------
# Dispatchers on uint8 device arrays


def _address(arr) -> int:
    iface = getattr(arr, "__cuda_array_interface__", None)
    if iface is None:  # the simulator's arrays are numpy arrays underneath
        iface = arr.__array_interface__
    return int(iface["data"][0])


def _bytes(arr, nbytes: int, what: str, itemsize: int):
    """(the first nbytes of a flat uint8 device array, its address), checked for size and
    alignment. An array of exactly nbytes is returned as it is (slicing costs host time)."""
    if np.dtype(arr.dtype) != np.uint8 or len(arr.shape) != 1:
        raise ValueError(f"{what}: expected a flat uint8 device array, got {arr.dtype}{arr.shape}")
    size = arr.shape[0]
    if size < nbytes:
        raise ValueError(f"{what}: {size} bytes, {nbytes} needed")
    address = _address(arr)
    if address % itemsize:
        raise ValueError(f"{what}: address not aligned to {itemsize} bytes")
    return (arr if size == nbytes else arr[:nbytes]), address


def _check_apart(pa: int, a_bytes: int, pb: int, b_bytes: int, what: str) -> None:
    if pa < pb + b_bytes and pb < pa + a_bytes:
        raise ValueError(f"{what}: source and destination overlap")


def convert(src_u8, dst_u8, src_dtype: str, dst_dtype: str, numel: int, stream=0) -> None:
    """Convert `numel` floats between F32, F16 and BF16 (safetensors spellings).

    `src_u8` and `dst_u8` are flat uint8 device arrays holding at least the bytes needed, aligned
    to their element size. They may be the same memory only when both element sizes are equal
    and they start at the same address (BF16 <-> F16 in place; identical dtypes do nothing).
    """
    for name in (src_dtype, dst_dtype):
        if name not in FLOAT_CONVERTIBLE:
            raise ValueError(f"not a convertible float dtype: {name!r}")
    if numel < 0:
        raise ValueError(f"negative element count {numel}")
    if numel == 0:
        return
    s_size, d_size = _ITEMSIZE[src_dtype], _ITEMSIZE[dst_dtype]
    src, ps = _bytes(src_u8, numel * s_size, "source", s_size)
    dst, pd = _bytes(dst_u8, numel * d_size, "destination", d_size)
    if ps == pd and s_size == d_size:
        if src_dtype == dst_dtype:
            return
    else:
        _check_apart(ps, numel * s_size, pd, numel * d_size, "convert")
    kernel = _CONVERT_KERNELS[(src_dtype, dst_dtype)]
    _launch_map(kernel, src.view(_UINT[s_size]), dst.view(_UINT[d_size]), numel, stream)


def dequantize_fp8(
    w_u8,
    scale_u8,
    out_u8,
    fp8_dtype: str,
    out_dtype: str,
    rows: int,
    cols: int,
    block: int = 128,
    stream=0,
) -> None:
    """Dequantize a row-major [rows, cols] FP8 matrix with float32 scales of one per block.

    `scale_u8` holds float32 [ceil(rows / block), ceil(cols / block)], row-major; the result,
    [rows, cols] of `out_dtype` (BF16, F16 or F32), goes to `out_u8`.
    """
    if fp8_dtype not in FP8_DEQUANTIZABLE:
        raise ValueError(f"not a dequantizable FP8 dtype: {fp8_dtype!r}")
    if out_dtype not in FLOAT_CONVERTIBLE:
        raise ValueError(f"not a float target: {out_dtype!r}")
    if block <= 0 or rows < 0 or cols < 0:
        raise ValueError(f"bad geometry rows={rows} cols={cols} block={block}")
    n = rows * cols
    if n == 0:
        return
    o_size = _ITEMSIZE[out_dtype]
    n_scale = _cdiv(rows, block) * _cdiv(cols, block)
    w, pw = _bytes(w_u8, n, "weight", 1)
    sc, ps = _bytes(scale_u8, n_scale * 4, "scale", 4)
    out, po = _bytes(out_u8, n * o_size, "output", o_size)
    _check_apart(pw, n, po, n * o_size, "dequantize_fp8 weight/output")
    _check_apart(ps, n_scale * 4, po, n * o_size, "dequantize_fp8 scale/output")
    launch_dequant_fp8(
        w,
        sc.view(np.float32),
        fp8_device_table(fp8_dtype),
        out.view(_UINT[o_size]),
        out_dtype,
        rows,
        cols,
        block,
        stream,
    )


def transpose2d(src_u8, dst_u8, rows: int, cols: int, itemsize: int, stream=0) -> None:
    """Write the [cols, rows] transpose of the row-major [rows, cols] matrix in `src_u8`.

    Elements of 1, 2, 4 or 8 bytes; source and destination must not overlap.
    """
    if itemsize not in _UINT:
        raise ValueError(f"itemsize must be 1, 2, 4 or 8, got {itemsize}")
    if rows < 0 or cols < 0:
        raise ValueError(f"bad shape [{rows}, {cols}]")
    nbytes = rows * cols * itemsize
    if nbytes == 0:
        return
    src, ps = _bytes(src_u8, nbytes, "source", itemsize)
    dst, pd = _bytes(dst_u8, nbytes, "destination", itemsize)
    _check_apart(ps, nbytes, pd, nbytes, "transpose2d")
    launch_transpose(src.view(_UINT[itemsize]), dst.view(_UINT[itemsize]), rows, cols, stream)
