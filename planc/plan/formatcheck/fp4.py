"""The plan reader's checks of the `mxfp4` and `nvfp4` formats: a part dequantizing packed FP4 and
its block scales, and its kernel record (`planc.base.fp4`; launched by
`planc.execute.kernels.formats.fp4`)."""

from __future__ import annotations

from ...base import fp4
from ...base.dtypes import DTYPES
from ..checkbase import _bad
from ..hostcost import scratch_bytes
from ..records import Kernel, Part
from .base import FormatCheck


class Fp4Check(FormatCheck):
    """Both FP4 formats: the weight and scale dtypes say which (`fp4.format_of`)."""

    def __init__(self, name: str):
        self.name = name

    def part(self, n: Part, at: str) -> None:
        """An FP4 dequantization's sizes follow from its inputs (`planc.base.fp4`)."""
        w, s = n.inputs[0], n.inputs[1]
        fmt = fp4.format_of(w.dtype, s.dtype)
        roles = ("weight", "scale", "scale2")[:len(n.inputs)]
        if tuple(i.role for i in n.inputs) != roles or len(n.inputs) != (3 if fmt == "nvfp4" else 2):
            raise _bad(f"{at}.inputs", f"a {fmt} dequantize reads a weight and its scale"
                       + (" and its per-tensor scale" if fmt == "nvfp4" else ""))
        why = fp4.weight_problem(fmt, w.shape, w.dtype, n.op == "dequantize_t")
        if why:
            raise _bad(f"{at}.inputs[0]", f"is not a {fmt} weight: {why}")
        if s.shape != fp4.scale_shape(fmt, w.shape):
            raise _bad(f"{at}.inputs[1].shape", f"a {fmt} weight {list(w.shape)} has scales "
                                                f"{list(fp4.scale_shape(fmt, w.shape))}, got {list(s.shape)}")
        if fmt == "nvfp4" and (n.inputs[2].dtype != fp4.SCALE2_DTYPE or not fp4.scale2_ok(n.inputs[2].shape)):
            raise _bad(f"{at}.inputs[2]", "an nvfp4 per-tensor scale is one F32")
        if n.block != fp4.BLOCK[fmt]:
            raise _bad(f"{at}.block", f"a {fmt} block is {fp4.BLOCK[fmt]} values, got {n.block}")
        if n.out_dtype not in ("BF16", "F16", "F32"):
            raise _bad(f"{at}.out_dtype", f"a dequantize produces BF16, F16 or F32, got {n.out_dtype}")
        batch, rows, cols = fp4.geometry(fmt, w.shape)
        want = batch * rows * cols * DTYPES[n.out_dtype].itemsize
        if n.out_bytes != want:
            raise _bad(f"{at}.out_bytes", f"is {n.out_bytes:,}, but {batch * rows * cols:,} values of {n.out_dtype} "
                                          f"are {want:,} bytes")
        reads = sum(i.nbytes for i in n.inputs)
        if n.path == "host":
            host = reads + n.out_bytes + scratch_bytes(n.op, w.dtype, n.out_dtype, n.out_bytes,
                                                       DTYPES[n.out_dtype].itemsize)
            if n.host_bytes != host or n.landing_bytes:
                raise _bad(f"{at}.host_bytes", f"a host-path {n.op} holds {host:,} bytes (reads + output + "
                                               f"scratch), got {n.host_bytes:,} (and landing {n.landing_bytes:,})")
        elif n.host_bytes or n.landing_bytes != reads:
            raise _bad(f"{at}.landing_bytes", f"a direct-path {n.op} lands its {reads:,} read bytes and holds no "
                                              f"host bytes, got {n.landing_bytes:,} and {n.host_bytes:,}")

    def kernel(self, k: Kernel, parts, in_run, at, limits) -> None:
        """Part `k.part`'s dequantization, its geometry and regions as the part's FP4 weight gives them."""
        p = parts[k.part]
        src_dtype, dst_dtype, space, src, scale, dst = (k.src_dtype, k.dst_dtype, k.src_space, k.src_offset,
                                                        k.scale_offset, k.dst_offset)
        numel, rows, cols, block = k.numel, k.rows, k.cols, k.block
        w, s = p.inputs[0], p.inputs[1]
        fmt = fp4.format_of(w.dtype, s.dtype)
        batch, want_rows, want_cols = fp4.geometry(fmt, w.shape)
        if p.path != "direct":
            raise _bad(at(".part"), f"part {p.id} takes the host path; its work is not a device kernel")
        if (src_dtype, dst_dtype, dst, block) != (w.dtype, p.out_dtype, p.dst_offset, p.block):
            raise _bad(at(), f"does not match part {p.id} ({fmt} {w.dtype} -> {p.out_dtype} at arena "
                             f"{p.dst_offset:,}, block {p.block})")
        if (rows, cols, numel) != (want_rows, want_cols, batch * want_rows * want_cols):
            raise _bad(at(), f"geometry [{rows}, {cols}] x {numel:,} values does not match part {p.id}'s "
                             f"{fmt} weight {list(w.shape)}")
        if space != "landing" or scale is None:
            raise _bad(at(".src_space"), f"a {fmt} dequantize reads its weight and scales from the landing region")
        ends = [("src_offset", src, w.nbytes), ("scale_offset", scale, s.nbytes)]
        if fmt == "nvfp4":
            ends.append(("scale_offset", fp4.scale2_offset(scale, s.nbytes), 4))
        for field, a, n in ends:
            if a + n > limits["landing"]:
                raise _bad(at(f".{field}"), f"[{a:,}, {a + n:,}) reaches past the landing region "
                                            f"({limits['landing']:,} bytes)")
        if dst + p.out_bytes > limits["arena"]:
            raise _bad(at(".dst_offset"), f"[{dst:,}, {dst + p.out_bytes:,}) reaches past the arena")
