"""`gguf`: GGUF blocks (U8 rows of whole blocks, in the landing region) of the part's GGML type
dequantized to F32, F16 or BF16 (`planc.execute.kernels.gguf_kernels`; host: `planc.execute.kernels.gguf_dequant`),
bit-exact to the `gguf` package's dequantization rounded once."""

from __future__ import annotations

import numpy as np

from ....base.dtypes import DTYPES, FLOAT_CONVERTIBLE
from .. import signatures
from ..gguf_dispatch import dequantize_gguf
from .base import Format


class Gguf(Format):
    name = "gguf"

    def launch(self, runs, r, k) -> None:
        src = runs.regions.dst(k.src_space, r, k.src_offset, k.rows * k.cols)
        d_size = DTYPES[k.dst_dtype].itemsize
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * d_size]
        out = dst.view(np.uint32 if d_size == 4 else np.uint16)
        dequantize_gguf(src, out, runs.plan.parts[k.part].ggml, k.dst_dtype, k.numel, stream=runs.kstream,
                        dev=runs.dev, row=k.numel // k.rows if k.rows else 0, hd=k.unpermute)

    def host(self, p, bufs):
        from ....manifest.ggml_types import quant_type
        from ....manifest.gguf_names import unpermute_rows
        from ..gguf_dequant import dequantize

        qt = quant_type(p.ggml)
        rows, row = p.inputs[0].shape
        out = dequantize(bufs[0], p.ggml, (rows, row // qt.block_bytes * qt.block), p.out_dtype)
        if p.unpermute:  # a q / k weight's rows in transformers' order, head by head
            out = unpermute_rows(out.reshape(rows, -1), rows // p.unpermute)
        return out.reshape(-1).view(np.uint8)

    def warm_key(self, plan, k) -> tuple:
        return (plan.parts[k.part].ggml, k.dst_dtype)

    def warm(self, dev, key, buf, out, stream) -> None:
        from ....manifest.ggml_types import quant_type

        ggml, dst = key
        dequantize_gguf(buf, out.view(np.uint32 if dst == "F32" else np.uint16), ggml, dst, quant_type(ggml).block,
                        stream=stream, dev=dev)

    def launches(self) -> list:
        return [signatures.gguf_launch(t, d) for t in sorted(signatures.GGUF_DEQUANTIZABLE)
                for d in sorted(FLOAT_CONVERTIBLE)]
