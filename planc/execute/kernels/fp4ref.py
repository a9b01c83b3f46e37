"""Reference dequantization of MXFP4 and NVFP4, written from the formats' definitions, and the
host path (`on: host`) that uses it. numpy and ml_dtypes only.

The bits every implementation (host path, device kernels, verification) must produce:

* E2M1 (one nibble): sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; the values
  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (-0 included). A byte holds two: the low nibble
  is the earlier value.
* MXFP4: v = e2m1 x 2^(s - 127) with s the block's E8M0 byte; s = 255 is NaN (the whole block:
  every value the target's quiet NaN, positive). The product is exact in float32 (2^-127 is a
  float32 subnormal) or past its range (4 and 6 times 2^127: infinity), so BF16 and F32 are exact; F16 rounds it to nearest, ties to even
  (overflow to infinity, underflow through the subnormals to zero).
* NVFP4: v = e2m1 x (float32(weight_scale) x weight_scale_2): the block's scale is one float32
  product, rounded once, then times the E2M1 value in float32, rounded once, then rounded to the
  target (BF16 as ml_dtypes, F16 as numpy, F32 kept). A NaN anywhere gives the target's
  positive quiet NaN.
* `transpose`: the last two dims of the dequantized tensor swapped.

Work goes a chunk of at most `planc.plan.hostcost.CHUNK_VALUES` values at a time (rows, and blocks of a
row when a row alone is longer), written straight to its place in the output, transposed or not,
so the float32 temporaries are the chunk scratch the host path's cost model counts beside the read
buffers and the output (a transpose holds no second copy of the output).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from planc.base import fp4
from planc.base.dtypes import dtype
from planc.plan.hostcost import CHUNK_VALUES

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def e2m1_pairs(b: np.ndarray) -> np.ndarray:
    """float32 values of packed E2M1 bytes `[..., n]` -> `[..., 2n]`, the low nibble first."""
    out = np.empty((*b.shape[:-1], b.shape[-1] * 2), dtype=np.float32)
    out[..., 0::2] = E2M1[b & 0x0F]
    out[..., 1::2] = E2M1[b >> 4]
    return out


def e8m0(s: np.ndarray) -> np.ndarray:
    """float32 2^(s - 127) of E8M0 bytes; 255 is NaN. (2^-127 is a float32 subnormal: exact.)"""
    s = np.asarray(s, dtype=np.uint8)
    bits = np.where(s == 0, np.uint32(0x00400000), s.astype(np.uint32) << 23)
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(s == 255, np.float32(np.nan), out)


def _target(out_dtype: str):
    if out_dtype not in ("BF16", "F16", "F32"):
        raise ValueError(f"not a float target: {out_dtype!r}")
    return dtype(out_dtype).numpy


def _finish(vals: np.ndarray, nan: np.ndarray | None, d_np) -> np.ndarray:
    if nan is not None:
        vals = np.where(nan, np.float32(np.nan), vals)  # a positive quiet NaN, whatever the sign
    with np.errstate(over="ignore", invalid="ignore"):
        return vals.astype(d_np)


def mxfp4(blocks: np.ndarray, scales: np.ndarray, out_dtype: str = "BF16", transpose: bool = False) -> np.ndarray:
    """Dequantize MXFP4: `blocks` U8 `[..., R, G, 16]`, `scales` U8 `[..., R, G]` -> `[..., R, G * 32]`
    of `out_dtype` (or `[..., G * 32, R]` with `transpose`)."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or scales.shape != blocks.shape[:-1]:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} with scales {list(scales.shape)}: expected "
                         f"[..., G, 16] and [..., G]")
    d_np = _target(out_dtype)
    lead, g = blocks.shape[:-2], blocks.shape[-2]
    if transpose and not lead:
        raise ValueError("a transpose needs a row dim")
    rows = lead[-1] if lead else 1
    flat_b = blocks.reshape(-1, rows, g, 16)
    flat_s = scales.reshape(-1, rows, g)
    batch, cols = flat_b.shape[0], g * 32
    out = np.empty((batch, cols, rows) if transpose else (batch, rows, cols), dtype=d_np)
    step = max(1, CHUNK_VALUES // max(1, cols))
    gw = max(1, min(g, CHUNK_VALUES // 32))  # groups of a row at a time
    for b in range(batch):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            for g0 in range(0, g, gw):
                g1 = min(g, g0 + gw)
                s = flat_s[b, r0:r1, g0:g1]
                with np.errstate(over="ignore"):  # 6 x 2^127 is past float32: infinity, as in the target
                    v = e2m1_pairs(flat_b[b, r0:r1, g0:g1]) * e8m0(s)[..., None]  # [n, G, 32], exact or infinite
                vals = _finish(v, (s == 255)[..., None], d_np).reshape(r1 - r0, (g1 - g0) * 32)
                del v
                if transpose:
                    out[b, g0 * 32:g1 * 32, r0:r1] = vals.T
                else:
                    out[b, r0:r1, g0 * 32:g1 * 32] = vals
    return out.reshape(*lead[:-1], cols, rows) if transpose else out.reshape(*lead, cols)


def nvfp4(weight: np.ndarray, scale: np.ndarray, scale_2, out_dtype: str = "BF16",
          transpose: bool = False) -> np.ndarray:
    """Dequantize NVFP4: `weight` U8 `[R, C / 2]`, `scale` F8_E4M3 bytes (or values) `[R, C / 16]`,
    `scale_2` an F32 scalar -> `[R, C]` of `out_dtype` (or `[C, R]` with `transpose`)."""
    weight = np.asarray(weight, np.uint8)
    scale = np.asarray(scale)
    if scale.dtype == np.uint8:
        scale = scale.view(ml_dtypes.float8_e4m3fn)
    rows, half = weight.shape
    if half % 8 or scale.shape != (rows, half // 8):
        raise ValueError(f"NVFP4 weight {list(weight.shape)} with scale {list(scale.shape)}: expected "
                         f"[R, C / 2] and [R, C / 16]")
    d_np = _target(out_dtype)
    s2 = np.float32(np.asarray(scale_2, dtype=np.float32).reshape(-1)[0])
    cols, nb = half * 2, half // 8  # values and 16-value blocks a row
    out = np.empty((cols, rows) if transpose else (rows, cols), dtype=d_np)
    step = max(1, CHUNK_VALUES // max(1, cols))
    bw = max(1, min(nb, CHUNK_VALUES // 16))  # blocks of a row at a time
    with np.errstate(over="ignore", invalid="ignore"):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            for j0 in range(0, nb, bw):
                j1 = min(nb, j0 + bw)
                bs = scale[r0:r1, j0:j1].astype(np.float32) * s2  # one float32 product per block
                v = e2m1_pairs(weight[r0:r1, j0 * 8:j1 * 8]).reshape(r1 - r0, j1 - j0, 16) * bs[..., None]
                vals = _finish(v, np.isnan(v), d_np).reshape(r1 - r0, (j1 - j0) * 16)
                del v
                if transpose:
                    out[j0 * 16:j1 * 16, r0:r1] = vals.T
                else:
                    out[r0:r1, j0 * 16:j1 * 16] = vals
    return out


# -- the host path: raw bytes in, raw bytes out -----------------------------------------------

def host_dequantize(p, bufs: list) -> np.ndarray:
    """The raw output bytes of an FP4 host-path part (`p`: an `ir.Part`, `bufs`: its inputs' bytes)."""
    w, s = p.inputs[0], p.inputs[1]
    fmt = fp4.format_of(w.dtype, s.dtype)
    transpose = p.op == "dequantize_t"
    if fmt == "mxfp4":
        out = mxfp4(bufs[0].reshape(w.shape), bufs[1].reshape(s.shape), p.out_dtype, transpose)
    elif fmt == "nvfp4":
        out = nvfp4(bufs[0].reshape(w.shape), bufs[1].reshape(s.shape), bufs[2].view(np.float32), p.out_dtype,
                    transpose)
    else:
        raise ValueError(f"{p.label}: not an FP4 dequantization ({w.dtype} with {s.dtype} scales)")
    return out.reshape(-1).view(np.uint8)


def is_fp4(p) -> bool:
    return len(p.inputs) >= 2 and fp4.format_of(p.inputs[0].dtype, p.inputs[1].dtype) is not None
