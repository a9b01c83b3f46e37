"""Launcher of the FP4 dequantization kernels (`planc.execute.kernels.fp4_kernels`): sizes and alignment
checked, the geometry chosen, each launch named. Imports no numba.

Input: flat uint8 device arrays (slices of the landing region and the arena are fine): the packed
weight, its block scales and, for NVFP4, its per-tensor F32 scale; `batch` matrices of [rows, cols]
dequantized values. Output: one launch of `{format}_{target}` (as stored) or `{format}t_{target}`
(the last two dims swapped) through the device's `launch`, on the grid it chooses (`dev.grid`,
`planc.execute.device.geometry`).

Invariants: cols is a whole number of the format's blocks (so no scale spans two rows); the output
never overlaps an input; the per-tensor scale is 4-byte aligned (the schedule lands it so,
`planc.base.fp4.scale2_offset`).
"""

from __future__ import annotations

import numpy as np

from ...base import fp4
from . import dispatch

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_UINT = {2: np.uint16, 4: np.uint32}
TILE_ROWS, TILE_VALUES = 32, 64  # the transposing kernels' tile (`fp4_kernels`)


def kernel_name(fmt: str, out_dtype: str, transpose: bool) -> str:
    return f"{fmt}{'t' if transpose else ''}_{out_dtype}"


def geometry(grid, numel: int, rows: int, cols: int, transpose: bool):
    """(grid, block) of a launch over `numel` values on a device's `grid`: 1-D over bytes, or tiles
    of [32 rows, 64 values]."""
    if not transpose:
        return grid.map(numel // 2)
    batch = numel // (rows * cols)
    padded = -(-rows // TILE_ROWS) * TILE_ROWS  # tiles do not cross from one matrix into the next
    return grid.tiles(batch * padded, cols, TILE_ROWS, TILE_VALUES)


def dequantize_fp4(w_u8, scale_u8, scale2_u8, out_u8, fmt: str, out_dtype: str, batch: int, rows: int, cols: int,
                   transpose: bool = False, stream=0, *, dev) -> None:
    """Dequantize `batch` [rows, cols] matrices of `fmt` (mxfp4 | nvfp4) into `out_dtype` (BF16, F16,
    F32), each [cols, rows] with `transpose`. `scale2_u8`: NVFP4's 4 bytes of F32 (None for MXFP4).
    `dev`: the device."""
    if fmt not in fp4.FORMATS:
        raise ValueError(f"not an FP4 format: {fmt!r}")
    if out_dtype not in _ITEMSIZE:
        raise ValueError(f"not a float target: {out_dtype!r}")
    block = fp4.BLOCK[fmt]
    if batch < 0 or rows < 0 or cols < 0 or cols % block:
        raise ValueError(f"bad geometry batch={batch} rows={rows} cols={cols} ({fmt}: cols a multiple of {block})")
    numel = batch * rows * cols
    if numel == 0:
        return
    o_size = _ITEMSIZE[out_dtype]
    n_w, n_s, n_o = numel // 2, numel // block, numel * o_size
    w, pw = dispatch._bytes(w_u8, n_w, "weight", 1)
    s, ps = dispatch._bytes(scale_u8, n_s, "scale", 1)
    out, po = dispatch._bytes(out_u8, n_o, "output", o_size)
    dispatch._check_apart(pw, n_w, po, n_o, f"dequantize_{fmt} weight/output")
    dispatch._check_apart(ps, n_s, po, n_o, f"dequantize_{fmt} scale/output")
    out = out.view(_UINT[o_size])
    name = kernel_name(fmt, out_dtype, transpose)
    grid, threads = geometry(dev.grid, numel, rows, cols, transpose)
    if fmt == "mxfp4":
        dev.launch(name, grid, threads, stream, w, s, out, batch, rows, cols)
        return
    if scale2_u8 is None:
        raise ValueError("nvfp4 needs its per-tensor scale")
    s2, p2 = dispatch._bytes(scale2_u8, 4, "scale_2", 4)
    dispatch._check_apart(p2, 4, po, n_o, "dequantize_nvfp4 scale_2/output")
    dev.launch(name, grid, threads, stream, w, s, dispatch.fp8_device_table("F8_E4M3", dev), s2.view(np.float32),
               out, batch, rows, cols)
