"""`float`: F32 / F16 / BF16 to each other, one map kernel per pair (`planc.execute.kernels.kernels`); a
same-size conversion runs in place in the arena, any other reads the landing region. A part's `add`
(a constant added to each value in float32) picks the `add_{src}_{dst}` kernels."""

from __future__ import annotations

from ....base.dtypes import DTYPES, FLOAT_CONVERTIBLE
from .. import dispatch, signatures
from ..refconv import convert_host
from .base import Format


class Float(Format):
    name = "float"

    def launch(self, runs, r, k) -> None:
        s_size, d_size = DTYPES[k.src_dtype].bits // 8, DTYPES[k.dst_dtype].bits // 8
        src = runs.regions.dst(k.src_space, r, k.src_offset, max(1, k.numel * s_size))
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * d_size]
        if k.add:
            dispatch.convert_add(src, dst, k.src_dtype, k.dst_dtype, k.numel, k.add, stream=runs.kstream, dev=runs.dev)
        else:
            dispatch.convert(src, dst, k.src_dtype, k.dst_dtype, k.numel, stream=runs.kstream, dev=runs.dev)

    def host(self, p, bufs):
        return convert_host(bufs[0], p.inputs[0].dtype, p.out_dtype, p.add)

    def warm_key(self, plan, k) -> tuple:
        return (k.src_dtype, k.dst_dtype, bool(k.add))

    def warm(self, dev, key, buf, out, stream) -> None:
        a, b, adds = key
        dst = out if DTYPES[a].bits != DTYPES[b].bits else buf
        if adds:
            dispatch.convert_add(buf, dst, a, b, 1, -1.0, stream=stream, dev=dev)
        else:
            dispatch.convert(buf, dst, a, b, 1, stream=stream, dev=dev)

    def launches(self) -> list:
        pairs = [(a, b) for a in sorted(FLOAT_CONVERTIBLE) for b in sorted(FLOAT_CONVERTIBLE)]
        return [signatures.convert_launch(a, b) for a, b in pairs] + [signatures.add_launch(a, b) for a, b in pairs]
