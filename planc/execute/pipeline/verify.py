"""--verify: compare every loaded tensor with a host reference computed from the checkpoint.

Part by part, chunk by chunk: at most `planc.plan.verifycost.verify_chunk(plan)` bytes of source at a
time (an eighth of the plan's host budget, 64 KiB to 16 MiB); an FP8 dequantization by rows of one
scale band, or pieces of a row inside one block when a row is longer than the chunk; a transpose
and an FP4 dequantization need their whole source. What that holds at most is
`planc.plan.verifycost.verify_host_bytes(plan)`, which the executor admits against the live room and the
result reports. Bit-exact: the device bytes must equal the reference bytes.
"""

from __future__ import annotations

import os

import numpy as np

from ...base.dtypes import DTYPES
from ...plan.verifycost import gguf_rows, verify_chunk, verify_host_bytes
from ..kernels import fp4ref
from ..kernels.refconv import convert_host, dequantize_fp8_host, transpose_host


def _read(root: str, inp, off: int, n: int) -> np.ndarray:
    """Bytes [off, off + n) of what the input reads (its segments laid end to end)."""
    from ..io.reader import pread_exact

    buf = np.empty(n, dtype=np.uint8)
    path = os.path.join(root, inp.file)
    fd = os.open(path, os.O_RDONLY)
    try:
        for fo, size, rel in inp.segments():
            lo, hi = max(off, rel), min(off + n, rel + size)
            if lo < hi:
                pread_exact(fd, buf[lo - off:hi - off], fo + (lo - rel), path)
    finally:
        os.close(fd)
    return buf


def verify_model(plan, model) -> dict:
    root = plan.checkpoint.root
    arena = model._arena
    mismatches, compared = [], 0
    chunk = verify_chunk(plan)
    for p in plan.parts:
        ok, n = _verify_part(root, p, arena, chunk)
        if ok and p.zero_bytes:
            ok = _zeros(arena, p.dst_offset + p.out_bytes, p.zero_bytes, chunk)
        compared += n
        if not ok:
            mismatches.append(f"{p.label} ({p.inputs[0].tensor})")
    return {"ok": not mismatches, "tensors": len(plan.tensors), "parts": len(plan.parts),
            "bytes": compared, "mismatches": sorted(mismatches)[:50], "chunk_bytes": chunk,
            "predicted_host_bytes": verify_host_bytes(plan)}


def _zeros(arena, off: int, n: int, chunk: int) -> bool:
    return not any(_device(arena, off + a, min(chunk, n - a)).any() for a in range(0, n, chunk))


def _device(arena, off: int, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, np.uint8)
    return arena[off:off + n].copy_to_host()


def _verify_part(root: str, p, arena, chunk: int) -> tuple[bool, int]:
    w = p.inputs[0]
    dst, op = p.dst_offset, p.op
    if p.out_bytes == 0:  # a tensor of no elements: nothing to compare
        return True, 0
    s_size = DTYPES[w.dtype].bits // 8 or 1
    d_size = DTYPES[p.out_dtype].bits // 8 or 1
    if op in ("copy", "convert"):
        step = max(s_size, chunk // s_size * s_size)
        for off in range(0, w.nbytes, step):
            n = min(step, w.nbytes - off)
            ref = _read(root, w, off, n)
            if op == "convert":
                ref = convert_host(ref, w.dtype, p.out_dtype, p.add)
            if not np.array_equal(ref, _device(arena, dst + off // s_size * d_size, len(ref))):
                return False, off
        return True, p.out_bytes
    if op == "gguf":
        # Whole rows of blocks at a time, dequantized by the host reference (`planc.execute.kernels.gguf_dequant`).
        from .hostpath import gguf_host

        rows, row = w.shape
        step = gguf_rows(p, chunk)  # whole heads where the part unpermutes
        out_row = p.out_bytes // rows
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            raw = _read(root, w, r0 * row, n * row)
            ref = gguf_host(p._replace(inputs=(w._replace(shape=(n, row)),)), raw)
            if not np.array_equal(ref, _device(arena, dst + r0 * out_row, len(ref))):
                return False, r0 * out_row
        return True, p.out_bytes
    if op in ("dequantize", "dequantize_t") and fp4ref.is_fp4(p):
        # Whole inputs: an FP4 part's read bytes are bounded by the plan like a transpose's source.
        ref = fp4ref.host_dequantize(p, [_read(root, i, 0, i.nbytes) for i in p.inputs])
        return bool(np.array_equal(ref, _device(arena, dst, len(ref)))), p.out_bytes
    if op == "dequantize":
        rows, cols = w.shape
        b = p.block
        scale = _read(root, p.inputs[1], 0, p.inputs[1].nbytes)
        scols = -(-cols // b)
        step = max(1, chunk // cols)
        for br in range(-(-rows // b)):
            for r0 in range(br * b, min(rows, (br + 1) * b), step):
                r1 = min(rows, (br + 1) * b, r0 + step)
                if cols <= chunk:  # whole rows of one band
                    pieces = [(r0, r1, 0, cols, scale[br * scols * 4:(br + 1) * scols * 4])]
                else:  # one row at a time, in pieces inside one block (one scale each)
                    pieces = []
                    for c0 in _spans(cols, chunk, b):
                        c1 = min(cols, c0 + chunk, (c0 // b + 1) * b)
                        k = (br * scols + c0 // b) * 4
                        pieces.append((r0, r1, c0, c1, scale[k:k + 4]))
                for pr0, pr1, c0, c1, sb in pieces:
                    wb = _read(root, w, pr0 * cols + c0, (pr1 - pr0) * (c1 - c0))  # one row when c1 - c0 < cols
                    ref = dequantize_fp8_host(wb, sb, w.dtype, p.out_dtype, pr1 - pr0, c1 - c0, b)
                    at = dst + (pr0 * cols + c0) * d_size
                    if not np.array_equal(ref, _device(arena, at, len(ref))):
                        return False, at - dst
        return True, p.out_bytes
    if op == "transpose":
        rows, cols = w.shape
        src = _read(root, w, 0, w.nbytes)
        if w.dtype != p.out_dtype:
            src = convert_host(src, w.dtype, p.out_dtype)
        ref = transpose_host(src, rows, cols, d_size)
        return bool(np.array_equal(ref, _device(arena, dst, len(ref)))), p.out_bytes
    return False, 0


def _spans(cols: int, chunk: int, block: int):
    """Starts of the pieces of a row: at most `chunk` values, never across a block edge."""
    c0 = 0
    while c0 < cols:
        yield c0
        c0 = min(cols, c0 + chunk, (c0 // block + 1) * block)
