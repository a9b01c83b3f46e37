"""`transpose`: a 2-D tensor's [rows, cols] -> [cols, rows], elements of 1, 2, 4 or 8 bytes kept (on
the host a conversion may come first)."""

from __future__ import annotations

from ....base.dtypes import DTYPES
from .. import dispatch, signatures
from ..refconv import convert_host, transpose_host
from .base import Format


class Transpose(Format):
    name = "transpose"

    def launch(self, runs, r, k) -> None:
        size = DTYPES[k.src_dtype].bits // 8
        src = runs.regions.dst(k.src_space, r, k.src_offset, max(1, k.numel * size))
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * size]
        dispatch.transpose2d(src, dst, k.rows, k.cols, size, stream=runs.kstream, dev=runs.dev)

    def host(self, p, bufs):
        w = p.inputs[0]
        rows, cols = w.shape
        src = bufs[0] if w.dtype == p.out_dtype else convert_host(bufs[0], w.dtype, p.out_dtype)
        return transpose_host(src, rows, cols, DTYPES[p.out_dtype].bits // 8)

    def warm_key(self, plan, k) -> tuple:
        return (DTYPES[k.src_dtype].bits // 8,)

    def warm(self, dev, key, buf, out, stream) -> None:
        dispatch.transpose2d(buf, out, 1, 1, key[0], stream=stream, dev=dev)

    def launches(self) -> list:
        return [signatures.transpose_launch(s) for s in signatures.TRANSPOSE_SIZES]
