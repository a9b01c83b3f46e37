"""Kernel launchers: sizes and alignment checked, the launch geometry chosen, each launch named.

Input: flat uint8 device arrays of a device (`dev`, a `planc.execute.device.seam.Device`, always
passed in; slices of an arena are fine) and explicit sizes. Output: one launch through
`dev.launch`, by the kernel's stable name (`planc.execute.kernels.signatures`), on the grid the device
chooses (`dev.grid`, `planc.execute.device.geometry`); on a GPU it runs the machine code shipped with
the package. The kernels' source is `planc.execute.kernels.kernels` and `planc.execute.kernels.scatter`; this module
imports neither, nor numba.

* `convert`: F32 / F16 / BF16 to each other (BF16 <-> F16 may run in place); `convert_add` adds a
  constant to each value on the way;
* `dequantize_fp8`: FP8 (E4M3 / E5M2) times one float32 scale per block, rounded once;
* `transpose2d`: [rows, cols] -> [cols, rows] of 1-, 2-, 4- or 8-byte elements;
* `scatter`: one staged request's segments to their arena places (the table from `scatter_table`);
* `zero`: zero-fill of arena regions (tensor-parallel padding).

The `launch_*` functions take arrays already viewed with the element type of the kernel.
"""

from __future__ import annotations

import threading

import numpy as np

from ...base.dtypes import FLOAT_CONVERTIBLE, FP8_DEQUANTIZABLE
from .refconv import fp8_table
from .signatures import CONVERT_KERNEL, add_launch

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_1d(n: int, dev) -> tuple[int, int]:
    """(blocks, threads) for a 1-D grid-stride launch over n > 0 elements on `dev`."""
    return dev.grid.map(n)


# -- launchers: arrays already viewed with the kernel's element type ------------------------------

def launch_map(name: str, src, dst, n: int, stream=0, *, dev) -> None:
    """One elementwise kernel `name` (`f32_to_bf16`, `bf16_to_f16`, `copy`, ...) over `n` elements of
    arrays already viewed with its element types; the 16-bit conversions may run in place."""
    if n <= 0:
        return
    blocks, threads = dev.grid.map(n)
    dev.launch(name, blocks, threads, stream, src, dst, n)


def launch_dequant_fp8(
    w_u8, scale_f32, table_f32, out, out_dtype: str, rows: int, cols: int, block: int, stream=0, *, dev
) -> None:
    """out: uint16 for BF16/F16, uint32 for F32; table_f32: the 256-entry decode table."""
    if rows <= 0 or cols <= 0:
        return
    grid, threads = dev.grid.dequant(rows, cols)
    scols = _cdiv(cols, block)
    dev.launch(f"dequant_{out_dtype}", grid, threads, stream, w_u8, scale_f32, table_f32, out, rows, cols, block,
               scols)


def launch_transpose(src, dst, rows: int, cols: int, stream=0, *, dev) -> None:
    """src, dst: uint8, uint16, uint32 or uint64 arrays of rows * cols elements."""
    if rows <= 0 or cols <= 0:
        return
    grid, threads = dev.grid.transpose(rows, cols)
    size = np.dtype(src.dtype).itemsize
    dev.launch(f"transpose_{size}", grid, threads, stream, src, dst, rows, cols)


# -- FP8 decode tables, one device copy per (dtype, device), made on first use ---------------------

_tables: dict[tuple[str, int, bool], object] = {}  # (dtype, device index, whether device memory is host memory)
_tables_lock = threading.Lock()


def fp8_device_table(fp8_dtype: str, dev):
    """The device copy of the 256-entry float32 decode table of `fp8_dtype` on `dev`."""
    key = (fp8_dtype, dev.current_device(), dev.memory_is_host)
    with _tables_lock:
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = dev.to_device(fp8_table(fp8_dtype))
    return table


# -- dispatchers on flat uint8 device arrays -----------------------------------------------------

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


def _convert_views(src_u8, dst_u8, src_dtype: str, dst_dtype: str, numel: int):
    """(source, destination) of a conversion of `numel` floats, checked for dtype, size, alignment and
    overlap (the same memory only in place: equal element sizes, the same address), viewed with the
    kernels' element types; None for nothing to launch."""
    for name in (src_dtype, dst_dtype):
        if name not in FLOAT_CONVERTIBLE:
            raise ValueError(f"not a convertible float dtype: {name!r}")
    if numel < 0:
        raise ValueError(f"negative element count {numel}")
    if numel == 0:
        return None
    s_size, d_size = _ITEMSIZE[src_dtype], _ITEMSIZE[dst_dtype]
    src, ps = _bytes(src_u8, numel * s_size, "source", s_size)
    dst, pd = _bytes(dst_u8, numel * d_size, "destination", d_size)
    if not (ps == pd and s_size == d_size):
        _check_apart(ps, numel * s_size, pd, numel * d_size, "convert")
    return src.view(_UINT[s_size]), dst.view(_UINT[d_size]), ps == pd


def convert(src_u8, dst_u8, src_dtype: str, dst_dtype: str, numel: int, stream=0, *, dev) -> None:
    """Convert `numel` floats between F32, F16 and BF16 (safetensors spellings).

    `src_u8` and `dst_u8` are flat uint8 device arrays holding at least the bytes needed, aligned
    to their element size. They may be the same memory only when both element sizes are equal
    and they start at the same address (BF16 <-> F16 in place; identical dtypes do nothing).
    """
    views = _convert_views(src_u8, dst_u8, src_dtype, dst_dtype, numel)
    if views is None or (views[2] and src_dtype == dst_dtype):
        return
    name = "copy" if src_dtype == dst_dtype else CONVERT_KERNEL[(src_dtype, dst_dtype)]
    launch_map(name, views[0], views[1], numel, stream, dev=dev)


def convert_add(src_u8, dst_u8, src_dtype: str, dst_dtype: str, numel: int, add: float, stream=0, *,
                dev) -> None:
    """`convert` that adds the float32 `add` to each value before the rounding to `dst_dtype`
    (`planc.execute.kernels.refconv.convert_host(..., add)` gives the same bits); in place when both element
    sizes are equal and the arrays start at the same address."""
    views = _convert_views(src_u8, dst_u8, src_dtype, dst_dtype, numel)
    if views is None:
        return
    bits = int(np.array([add], dtype=np.float32).view(np.uint32)[0])
    name, _ = add_launch(src_dtype, dst_dtype)
    blocks, threads = dev.grid.map(numel)
    dev.launch(name, blocks, threads, stream, views[0], views[1], numel, bits)


def dequantize_fp8(w_u8, scale_u8, out_u8, fp8_dtype: str, out_dtype: str, rows: int, cols: int,
                   block: int = 128, stream=0, *, dev) -> None:
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
    launch_dequant_fp8(w, sc.view(np.float32), fp8_device_table(fp8_dtype, dev), out.view(_UINT[o_size]), out_dtype,
                       rows, cols, block, stream, dev=dev)


def transpose2d(src_u8, dst_u8, rows: int, cols: int, itemsize: int, stream=0, *, dev) -> None:
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
    launch_transpose(src.view(_UINT[itemsize]), dst.view(_UINT[itemsize]), rows, cols, stream, dev=dev)


# -- scatter and zero-fill ------------------------------------------------------------------------

def scatter_table(plan) -> tuple[np.ndarray, dict]:
    """All scattered requests' copies, one row each, in element units: (table int64 [n, 3],
    {(run, req): (first, last, longest)}), `longest` the most elements one of its rows moves."""
    # Filled in place (24 bytes a row, what the plan counts on the device), not built from a list of
    # Python tuples (several times that on the host while it is made).
    n = sum(len(q.copies) for r in plan.runs for q in r.requests if q.scatter)
    table, where, k = np.empty((n, 3), dtype=np.int64), {}, 0
    for r in plan.runs:
        for qi, q in enumerate(r.requests):
            if not q.scatter:
                continue
            w = q.width
            first, longest = k, 0
            for slot_off, _space, dst, nbytes, _rows, _pitch in q.copies:
                table[k] = (slot_off // w, dst // w, nbytes // w)
                longest = max(longest, nbytes // w)
                k += 1
            where[(r.index, qi)] = (first, k, longest)
    return table, where


def scatter_grid(nseg: int, longest: int, dev) -> tuple[int, int]:
    """(segments, blocks per segment) of one scatter launch on `dev` (`geometry.GpuGrid.scatter`:
    on a GPU the blocks follow the bytes, not the segments)."""
    return dev.grid.scatter(nseg, longest)[0]


def scatter(staging_u8, arena_u8, table_dev, first: int, last: int, width: int, stream, longest: int = 1, *,
            dev) -> None:
    """Move segments [first, last) of the table from the staging slot to the arena (`longest`: the
    most elements one of them moves, which sets the blocks each gets)."""
    if last <= first:
        return
    # A view in wider elements needs a whole number of them: the arena's size need not be one, but every
    # scattered copy lies in its width-aligned prefix (the plan codec checks offsets and lengths).
    src = staging_u8[:len(staging_u8) // width * width].view(_UINT[width])
    dst = arena_u8[:len(arena_u8) // width * width].view(_UINT[width])
    grid, threads = dev.grid.scatter(last - first, longest)
    dev.launch(f"scatter_{width}", grid, threads, stream, src, dst, table_dev, first, last)


def zero(arena_u8, regions, stream, *, dev) -> int:
    """Zero-fill (offset, bytes) regions of the arena: the padding of uneven tensor-parallel splits.
    Returns the kernels launched (one per non-empty region)."""
    launched = 0
    for off, n in regions:
        if n <= 0:
            continue
        blocks, threads = dev.grid.zero(n)
        dev.launch("zero", blocks, threads, stream, arena_u8[off:off + n], n)
        launched += 1
    return launched
