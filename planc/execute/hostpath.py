"""The host path: a part whose transform runs on the host, read into its own buffer, transformed
into host scratch, then staged through the ring slot by slot.
"""

from __future__ import annotations

import numpy as np

from . import fp4ref
from .refconv import convert_host, dequantize_fp8_host, transpose_host


class HostPath:
    """The host-path half of `Loader` (a mixin: the loader's state is one object)."""

    def _host_part(self, h) -> None:
        self._device()
        p = self.plan.parts[h.part]
        bufs = []
        for inp in p.inputs:
            buf = np.empty(inp.nbytes, dtype=np.uint8)
            for off, n, rel in inp.segments():
                if n:
                    self.reader.read_plain(inp.file, off, buf[rel:rel + n])
                self.counters["requests"] += 1
            bufs.append(buf)
        out = _host_transform(p, bufs)
        del bufs
        off = 0
        while off < len(out):
            n = min(self.slot, len(out) - off)
            slot = self._acquire_slot()
            buf = self.ring[slot]
            buf[:n] = out[off:off + n]
            self.dev.stage(buf, ((self.arena, h.dst_offset + off, 0, n, 1, 0),), self.stream)
            self.counters["copies"] += 1
            self._fence(slot)
            off += n
        self.counters["host_parts"] += 1
        if self.progress:
            self.progress(p.out_bytes, 1)


def _host_transform(p, bufs: list) -> np.ndarray:
    w = p.inputs[0]
    if p.op == "convert":
        return convert_host(bufs[0], w.dtype, p.out_dtype)
    if p.op in ("dequantize", "dequantize_t") and fp4ref.is_fp4(p):
        return fp4ref.host_dequantize(p, bufs)
    if p.op == "dequantize":
        rows, cols = w.shape
        return dequantize_fp8_host(bufs[0], bufs[1], w.dtype, p.out_dtype, rows, cols, p.block)
    if p.op == "transpose":
        rows, cols = w.shape
        src = bufs[0] if w.dtype == p.out_dtype else convert_host(bufs[0], w.dtype, p.out_dtype)
        from ..dtypes import DTYPES

        return transpose_host(src, rows, cols, DTYPES[p.out_dtype].bits // 8)
    return bufs[0]
