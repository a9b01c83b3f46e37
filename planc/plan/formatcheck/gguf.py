"""The plan reader's checks of the `gguf` format: a part of GGUF blocks (kept or dequantized) and
its kernel record (`planc.base.formats`; launched by `planc.execute.kernels.formats.gguf`)."""

from __future__ import annotations

from ...base.dtypes import DTYPES
from ...manifest.ggml_types import DEQUANTIZABLE, quant_type
from ..checkbase import _bad, _shown
from ..hostcost import scratch_bytes
from ..records import Kernel, Part
from .base import FormatCheck


class GgufCheck(FormatCheck):
    name = "gguf"

    def part(self, n: Part, at: str) -> None:
        """GGUF blocks: read as U8 rows of whole blocks of the part's GGML type; kept (`copy`, U8 out,
        the same bytes) or dequantized (`gguf`, F32 / F16 / BF16, one value per element)."""
        w = n.inputs[0]
        qt = quant_type(n.ggml)
        if qt is None:
            raise _bad(f"{at}.ggml", f"a {n.op} part of GGUF blocks names their GGML type, got {_shown(n.ggml)}")
        if n.op not in ("copy", "gguf"):
            raise _bad(f"{at}.op", f"GGUF {n.ggml} blocks are kept (copy) or dequantized (gguf), not {n.op}")
        if len(n.inputs) != 1 or w.role != "weight" or w.dtype != "U8" or len(w.shape) != 2:
            raise _bad(f"{at}.inputs", f"a {n.op} of GGUF blocks reads one weight of U8 rows, got "
                                       f"{[(i.role, i.dtype, list(i.shape)) for i in n.inputs]}")
        rows, row = w.shape
        if row == 0 or row % qt.block_bytes:
            raise _bad(f"{at}.inputs[0].shape", f"rows of {row:,} bytes are not whole {n.ggml} blocks of "
                                                f"{qt.block_bytes} bytes")
        if n.block:
            raise _bad(f"{at}.block", f"a part of GGUF blocks has no block edge, got {n.block}")
        if n.op == "copy":
            if n.out_dtype != "U8" or n.out_bytes != w.nbytes:
                raise _bad(f"{at}.out_dtype", f"kept {n.ggml} blocks are their {w.nbytes:,} U8 bytes, got "
                                              f"{n.out_dtype} x {n.out_bytes:,} bytes")
            if n.path != "direct" or n.landing_bytes or n.host_bytes:
                raise _bad(f"{at}.path", "kept GGUF blocks go straight to their place (direct, nothing landed)")
            return
        if n.ggml not in DEQUANTIZABLE:
            raise _bad(f"{at}.ggml", f"planc dequantizes {', '.join(sorted(DEQUANTIZABLE))}, not {n.ggml}")
        if n.out_dtype not in ("BF16", "F16", "F32"):
            raise _bad(f"{at}.out_dtype", f"a gguf dequantize produces BF16, F16 or F32, got {n.out_dtype}")
        if n.unpermute and (n.unpermute % 2 or rows % n.unpermute):
            raise _bad(f"{at}.unpermute", f"is {n.unpermute:,}: rows are unpermuted by heads of an even number of rows "
                                          f"that divides the part's {rows:,}")
        numel = rows * (row // qt.block_bytes) * qt.block
        want = numel * DTYPES[n.out_dtype].itemsize
        if n.out_bytes != want:
            raise _bad(f"{at}.out_bytes", f"is {n.out_bytes:,}, but {rows:,} rows of {row // qt.block_bytes:,} {n.ggml} "
                                          f"blocks are {numel:,} values of {n.out_dtype}, {want:,} bytes")
        if n.path == "host":
            host = w.nbytes + n.out_bytes + scratch_bytes(n.op, w.dtype, n.out_dtype, n.out_bytes,
                                                          DTYPES[n.out_dtype].itemsize)
            if n.host_bytes != host or n.landing_bytes:
                raise _bad(f"{at}.host_bytes", f"a host-path gguf holds {host:,} bytes (reads + output + scratch), "
                                               f"got {n.host_bytes:,} (and landing {n.landing_bytes:,})")
        elif n.host_bytes or n.landing_bytes != w.nbytes:
            raise _bad(f"{at}.landing_bytes", f"a direct-path gguf lands its {w.nbytes:,} block bytes and holds no "
                                              f"host bytes, got {n.landing_bytes:,} and {n.host_bytes:,}")

    def kernel(self, k: Kernel, parts, in_run, at, limits) -> None:
        """A GGUF dequantization of part `pid` and the parts in `more`: each a direct-path gguf part of
        this run, of one GGML type and row width; their blocks read end to end from `src`, their
        values written end to end from `dst`: the kernel's rows and values are theirs summed."""
        pid, more, src_dtype, dst_dtype, space, src, scale, dst = (k.part, k.more, k.src_dtype, k.dst_dtype, k.src_space,
                                                                   k.src_offset, k.scale_offset, k.dst_offset)
        numel, rows, cols, block, unpermute = k.numel, k.rows, k.cols, k.block, k.unpermute
        want_rows = want_numel = 0
        want_dst = dst
        for q in (pid, *more):
            if q not in in_run:
                raise _bad(at(".part"), f"part {q} is not a part of this run")
            p = parts[q]
            w = p.inputs[0]
            if p.op != "gguf" or p.path != "direct":
                raise _bad(at(".part"), f"part {q} is not a direct-path gguf part")
            if unpermute != p.unpermute:
                raise _bad(at(".unpermute"), f"is {unpermute:,}, but part {q}'s is {p.unpermute:,} (rows per head "
                                             f"written in transformers' order; 0: as stored)")
            if (src_dtype, dst_dtype, want_dst, block, cols, p.ggml, unpermute) != (
                    w.dtype, p.out_dtype, p.dst_offset, p.block, w.shape[1], parts[pid].ggml, p.unpermute):
                raise _bad(at(), f"does not match part {q} ({p.ggml} blocks {list(w.shape)} -> {p.out_dtype} at arena "
                                 f"{p.dst_offset:,}" + (f", rows unpermuted by heads of {p.unpermute}" if p.unpermute
                                                        else "") + ")")
            want_rows += w.shape[0]
            want_numel += p.out_bytes // DTYPES[p.out_dtype].itemsize
            want_dst += p.out_bytes
        if rows != want_rows:
            raise _bad(at(".rows"), f"is {rows:,}, its parts have {want_rows:,} rows of blocks")
        if numel != want_numel:
            raise _bad(at(".numel"), f"is {numel:,}, its parts have {want_numel:,} values")
        if space != "landing" or scale is not None:
            raise _bad(at(".src_space"), "a gguf dequantize reads its blocks from the landing region (and no scale)")
        if src + rows * cols > limits["landing"]:
            raise _bad(at(".src_offset"), f"[{src:,}, {src + rows * cols:,}) reaches past the landing region "
                                          f"({limits['landing']:,} bytes)")
        if want_dst > limits["arena"]:
            raise _bad(at(".dst_offset"), f"[{dst:,}, {want_dst:,}) reaches past the arena")
