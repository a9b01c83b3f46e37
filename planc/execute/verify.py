"""--verify: compare every loaded tensor with a host reference computed from the checkpoint.

Part by part, chunk by chunk (at most CHUNK bytes of source at a time; dequantization by bands of
`block` rows; a transpose needs its whole source, which the plan already bounds), so verification
stays within the host budget. Bit-exact: the device bytes must equal the reference bytes.
"""

from __future__ import annotations

import os

import numpy as np

from ..dtypes import DTYPES
from . import fp4ref
from .refconv import convert_host, dequantize_fp8_host, transpose_host

CHUNK = 16 * 2**20


def _read(root: str, inp, off: int, n: int) -> np.ndarray:
    """Bytes [off, off + n) of what the input reads (its segments laid end to end)."""
    from .reader import pread_exact

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
    for p in plan.parts:
        ok, n = _verify_part(root, p, arena)
        if ok and p.zero_bytes:
            ok = not _device(arena, p.dst_offset + p.out_bytes, p.zero_bytes).any()
        compared += n
        if not ok:
            mismatches.append(f"{p.label} ({p.inputs[0].tensor})")
    return {"ok": not mismatches, "tensors": len(plan.tensors), "parts": len(plan.parts),
            "bytes": compared, "mismatches": sorted(mismatches)[:50]}


def _device(arena, off: int, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, np.uint8)
    return arena[off:off + n].copy_to_host()


def _verify_part(root: str, p, arena) -> tuple[bool, int]:
    w = p.inputs[0]
    dst, op = p.dst_offset, p.op
    s_size = DTYPES[w.dtype].bits // 8 or 1
    d_size = DTYPES[p.out_dtype].bits // 8 or 1
    if op in ("copy", "convert"):
        step = max(s_size, CHUNK // s_size * s_size)
        for off in range(0, w.nbytes, step):
            n = min(step, w.nbytes - off)
            ref = _read(root, w, off, n)
            if op == "convert":
                ref = convert_host(ref, w.dtype, p.out_dtype)
            if not np.array_equal(ref, _device(arena, dst + off // s_size * d_size, len(ref))):
                return False, off
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
        for br in range(-(-rows // b)):
            r0, r1 = br * b, min(rows, (br + 1) * b)
            wb = _read(root, w, r0 * cols, (r1 - r0) * cols)
            sb = scale[br * scols * 4:(br + 1) * scols * 4]
            ref = dequantize_fp8_host(wb, sb, w.dtype, p.out_dtype, r1 - r0, cols, b)
            if not np.array_equal(ref, _device(arena, dst + r0 * cols * d_size, len(ref))):
                return False, r0 * cols * d_size
        return True, p.out_bytes
    if op == "transpose":
        rows, cols = w.shape
        src = _read(root, w, 0, w.nbytes)
        if w.dtype != p.out_dtype:
            src = convert_host(src, w.dtype, p.out_dtype)
        ref = transpose_host(src, rows, cols, d_size)
        return bool(np.array_equal(ref, _device(arena, dst, len(ref)))), p.out_bytes
    return False, 0
