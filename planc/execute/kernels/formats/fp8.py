"""`fp8`: FP8 (E4M3 / E5M2) weights times square F32 block scales (DeepSeek-V3), the scales landed
beside the weight."""

from __future__ import annotations

from ....base.dtypes import FLOAT_CONVERTIBLE
from .. import dispatch, signatures
from ..refconv import dequantize_fp8_host
from .base import Format


class Fp8(Format):
    name = "fp8"

    def launch(self, runs, r, k) -> None:
        rows, cols, b = k.rows, k.cols, k.block
        src = runs.regions.dst(k.src_space, r, k.src_offset, max(1, k.numel))
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * (4 if k.dst_dtype == "F32" else 2)]
        n_scale = -(-rows // b) * -(-cols // b)
        scale = runs.regions.dst("landing", r, k.scale_offset, n_scale * 4)
        dispatch.dequantize_fp8(src, scale, dst, k.src_dtype, k.dst_dtype, rows, cols, b, stream=runs.kstream,
                                dev=runs.dev)

    def host(self, p, bufs):
        rows, cols = p.inputs[0].shape
        return dequantize_fp8_host(bufs[0], bufs[1], p.inputs[0].dtype, p.out_dtype, rows, cols, p.block)

    def warm(self, dev, key, buf, out, stream) -> None:
        a, b = key
        dispatch.dequantize_fp8(buf[:8], buf[8:16], out, a, b, 1, 1, 128, stream=stream, dev=dev)

    def launches(self) -> list:
        return [signatures.dequant_launch(d) for d in sorted(FLOAT_CONVERTIBLE)]
