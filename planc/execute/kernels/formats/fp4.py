"""`mxfp4` and `nvfp4`: packed FP4 weights with E8M0 (MXFP4, 32 values a scale) or E4M3 (NVFP4, 16
values a scale, and a per-tensor F32 scale landed just after the block scales) block scales, as
stored or with the last two dims swapped (`dequantize_t`)."""

from __future__ import annotations

from ....base import fp4
from ....base.dtypes import FLOAT_CONVERTIBLE
from ....plan.formatcheck import CHECKS
from .. import fp4_dispatch, fp4ref, signatures
from .base import Format


class Fp4(Format):
    def __init__(self, name: str):
        self.name = name
        self.check = CHECKS[name]

    def launch(self, runs, r, k) -> None:
        d_size = 4 if k.dst_dtype == "F32" else 2
        src = runs.regions.dst(k.src_space, r, k.src_offset, max(1, k.numel // 2))
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * d_size]
        n_scale = k.numel // k.block
        scale = runs.regions.dst("landing", r, k.scale_offset, n_scale)
        scale2 = (runs.regions.dst("landing", r, fp4.scale2_offset(k.scale_offset, n_scale), 4)
                  if self.name == "nvfp4" else None)
        fp4_dispatch.dequantize_fp4(src, scale, scale2, dst, self.name, k.dst_dtype, k.numel // (k.rows * k.cols),
                                    k.rows, k.cols, k.op == "dequantize_t", stream=runs.kstream, dev=runs.dev)

    def host(self, p, bufs):
        return fp4ref.host_dequantize(p, bufs)

    def warm_key(self, plan, k) -> tuple:
        return (k.op == "dequantize_t", k.dst_dtype)

    def warm(self, dev, key, buf, out, stream) -> None:
        transpose, dst = key
        fp4_dispatch.dequantize_fp4(buf[:16], buf[16:20], buf[32:36], out, self.name, dst, 1, 1, fp4.BLOCK[self.name],
                                    transpose, stream=stream, dev=dev)

    def launches(self) -> list:
        return [signatures.fp4_launch(self.name, d, t) for d in sorted(FLOAT_CONVERTIBLE) for t in (False, True)]
