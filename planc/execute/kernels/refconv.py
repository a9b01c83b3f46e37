"""Host-side reference conversions in numpy and ml_dtypes, on raw bytes.

These define the bits the GPU kernels in `planc.execute.kernels.kernels` must produce. They serve the
executor's host path, verification, and the kernel tests.

Semantics, all on little-endian raw bytes (the safetensors layout):

* float conversions go through float32: ``x.astype(np.float32).astype(target)``. Widening to
  float32 is exact; narrowing rounds to nearest, ties to even, overflows to infinity and keeps
  subnormals. float32 -> BF16 follows ml_dtypes (a NaN becomes the quiet NaN 0x7FC0 with its
  sign); float32 -> F16 follows numpy. BF16 -> F16 goes through float32 on purpose: a direct
  ml_dtypes cast turns a BF16 NaN into an infinity.
* FP8 block dequantization: ``out = target(float32(w) * float32(scale[r // B, c // B]))``, one
  float32 product rounded once to the target.
* 2-D transpose of a row-major [rows, cols] matrix of 1-, 2-, 4- or 8-byte elements.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from planc.base.dtypes import FLOAT_CONVERTIBLE, FP8_DEQUANTIZABLE, dtype
from planc.plan.hostcost import CHUNK_VALUES

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CONVERT_CHUNK = CHUNK_VALUES  # elements converted at a time: the scratch `planc.plan.hostcost` counts

_FP8_NUMPY = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


def _as_u8(buf: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(buf)
    if a.dtype != np.uint8:
        raise ValueError(f"expected raw uint8 bytes, got {a.dtype}")
    return a.reshape(-1)


def _float_numpy(name: str) -> np.dtype:
    if name not in FLOAT_CONVERTIBLE:
        raise ValueError(f"not a convertible float dtype: {name!r}")
    return dtype(name).numpy


def fp8_table(fp8_dtype: str) -> np.ndarray:
    """float32 value of each of the 256 bit patterns of an FP8 dtype (NaN patterns give NaN)."""
    if fp8_dtype not in FP8_DEQUANTIZABLE:
        raise ValueError(f"not a dequantizable FP8 dtype: {fp8_dtype!r}")
    return np.arange(256, dtype=np.uint8).view(_FP8_NUMPY[fp8_dtype]).astype(np.float32)


def convert_host(src_bytes: np.ndarray, src_dtype: str, dst_dtype: str, add: float = 0.0) -> np.ndarray:
    """Convert raw bytes of `src_dtype` floats to raw bytes of `dst_dtype` floats (F32/F16/BF16),
    adding `add` to each value in float32 (`add_f32`: the sum rounded to float32) before the rounding
    to `dst_dtype`, when it is not 0."""
    src = _as_u8(src_bytes)
    s_np, d_np = _float_numpy(src_dtype), _float_numpy(dst_dtype)
    if src.size % s_np.itemsize:
        raise ValueError(f"{src.size} bytes is not a whole number of {src_dtype} elements")
    x = src.view(s_np)
    if add:
        out = np.empty(x.size, dtype=d_np)
        for a in range(0, x.size, CONVERT_CHUNK):
            f32 = convert_host(x[a:a + CONVERT_CHUNK].view(np.uint8), src_dtype, "F32").view(np.uint32)
            out[a:a + CONVERT_CHUNK] = convert_host(add_f32(f32, add).view(np.uint8), "F32", dst_dtype).view(d_np)
        return out.view(np.uint8)
    if src_dtype == dst_dtype:
        return src.copy()
    # Chunk by chunk, so that the float32 intermediate stays small: the host path's cost model counts
    # the input and the output buffers and one chunk's scratch, not a float32 copy of the whole tensor.
    out = np.empty(x.size, dtype=d_np)
    with np.errstate(over="ignore", invalid="ignore"):
        for a in range(0, x.size, CONVERT_CHUNK):
            out[a:a + CONVERT_CHUNK] = x[a:a + CONVERT_CHUNK].astype(np.float32).astype(d_np)
    return out.view(np.uint8)


def add_f32(bits: np.ndarray, add: float) -> np.ndarray:
    """float32 values (as uint32 bits) plus the float32 `add`, rounded once; a NaN stays the NaN it
    was, made quiet (the device kernels' rule, so that the bits agree on every machine)."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = (bits.view(np.float32) + np.float32(add)).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, bits | np.uint32(0x400000), y).astype(np.uint32, copy=False)


def dequantize_fp8_host(
    w_bytes: np.ndarray,
    scale_bytes: np.ndarray,
    fp8_dtype: str,
    out_dtype: str,
    rows: int,
    cols: int,
    block: int = 128,
) -> np.ndarray:
    """Dequantize a row-major [rows, cols] FP8 matrix with float32 block scales.

    `scale_bytes` holds float32 [ceil(rows / block), ceil(cols / block)], row-major. Returns the
    raw bytes of the [rows, cols] result in `out_dtype` (BF16, F16 or F32).
    """
    w = _as_u8(w_bytes)
    sc = _as_u8(scale_bytes)
    d_np = _float_numpy(out_dtype)
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    if w.size != rows * cols:
        raise ValueError(f"{w.size} bytes of FP8 for a [{rows}, {cols}] matrix")
    srows, scols = -(-rows // block), -(-cols // block)
    if sc.size != srows * scols * 4:
        raise ValueError(f"{sc.size} bytes of scale for a [{srows}, {scols}] float32 grid")
    table = fp8_table(fp8_dtype)
    wm = w.reshape(rows, cols)
    s = sc.view(np.float32).reshape(srows, scols)
    out = np.empty((rows, cols), dtype=d_np)
    # A chunk of at most CHUNK_VALUES values: rows within one band of scales, and columns when a row
    # alone is longer (a per-tensor scale is one block as large as the matrix), so the float32
    # temporaries are what `planc.plan.hostcost` counts, whatever the block.
    width = min(cols, CHUNK_VALUES)
    step = max(1, CHUNK_VALUES // max(1, cols))
    with np.errstate(over="ignore", invalid="ignore"):
        for br in range(srows):
            for r0 in range(br * block, min(rows, (br + 1) * block), step):
                r1 = min(rows, (br + 1) * block, r0 + step)
                for c0 in range(0, cols, width):
                    c1 = min(cols, c0 + width)
                    prod = table[wm[r0:r1, c0:c1]]  # float32
                    prod *= _scale_span(s[br], c0, c1, block)[None, :]  # float32 * float32, rounded once
                    out[r0:r1, c0:c1] = prod.astype(d_np)
    return out.reshape(-1).view(np.uint8)


def _scale_span(srow: np.ndarray, c0: int, c1: int, block: int) -> np.ndarray:
    """The float32 scale of each column in [c0, c1) from one row of block scales."""
    j0, j1 = c0 // block, (c1 - 1) // block
    if j0 == j1:
        return np.full(c1 - c0, srow[j0], dtype=np.float32)
    counts = np.full(j1 - j0 + 1, block, dtype=np.int64)
    counts[0] = (j0 + 1) * block - c0
    counts[-1] = c1 - j1 * block
    return np.repeat(srow[j0:j1 + 1], counts)


def transpose_host(src_bytes: np.ndarray, rows: int, cols: int, itemsize: int) -> np.ndarray:
    """Raw bytes of the [cols, rows] transpose of a row-major [rows, cols] matrix."""
    src = _as_u8(src_bytes)
    if itemsize not in _UINT_OF_SIZE:
        raise ValueError(f"itemsize must be 1, 2, 4 or 8, got {itemsize}")
    if src.size != rows * cols * itemsize:
        raise ValueError(f"{src.size} bytes for a [{rows}, {cols}] matrix of {itemsize}-byte items")
    m = src.view(_UINT_OF_SIZE[itemsize]).reshape(rows, cols)
    return np.ascontiguousarray(m.T).reshape(-1).view(np.uint8)
