"""`gguf`: GGUF blocks (U8 rows of whole blocks, in the landing region) of the part's GGML type
dequantized to F32, F16 or BF16 (`planc.execute.kernels.gguf_kernels`; host: `planc.execute.kernels.gguf_dequant`),
bit-exact to the `gguf` package's dequantization rounded once."""

from __future__ import annotations

import numpy as np

from ....base.dtypes import DTYPES, FLOAT_CONVERTIBLE
from ....plan.formatcheck import CHECKS
from .. import signatures
from ..gguf_dispatch import dequantize_gguf
from .base import Format


class Gguf(Format):
    name = "gguf"
    check = CHECKS["gguf"]

    def launch(self, runs, r, k) -> None:
        src = runs.regions.dst(k.src_space, r, k.src_offset, k.rows * k.cols)
        d_size = DTYPES[k.dst_dtype].itemsize
        dst = runs.regions.arena[k.dst_offset:k.dst_offset + k.numel * d_size]
        out = dst.view(np.uint32 if d_size == 4 else np.uint16)
        dequantize_gguf(src, out, runs.plan.parts[k.part].ggml, k.dst_dtype, k.numel, stream=runs.kstream,
                        dev=runs.dev, row=k.numel // k.rows if k.rows else 0, hd=k.unpermute)

    def host(self, p, bufs):
        from ....manifest.ggml_types import quant_type
        from ..gguf_dequant import dequantize

        qt = quant_type(p.ggml)
        rows, row = p.inputs[0].shape
        cols = row // qt.block_bytes * qt.block
        if not p.unpermute:
            return dequantize(bufs[0], p.ggml, (rows, cols), p.out_dtype).reshape(-1).view(np.uint8)
        return _unpermuted(bufs[0], p.ggml, rows, row, cols, p.out_dtype, p.unpermute, dequantize)

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


def _unpermuted(raw, ggml: str, rows: int, row: int, cols: int, out_dtype: str, hd: int, dequantize) -> np.ndarray:
    """A q / k weight's values in transformers' order, dequantized a band of stored rows at a time
    (`CHUNK_VALUES` values, whole heads or whole row pairs of one head) straight into their rows of
    the output: the output and one band, never a second output (the part's counted host bytes).
    Stored row h*hd + 2i + j is row h*hd + j*hd/2 + i (`planc.manifest.gguf_names.unpermute_rows`)."""
    from ....plan.hostcost import CHUNK_VALUES

    raw = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    import ml_dtypes

    out = np.empty((rows, cols), {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[out_dtype])
    half = hd // 2
    view = out.reshape(rows // hd, 2, half, cols).swapaxes(1, 2)  # [h, i, j]: stored row h*hd + 2i + j
    per = max(2, CHUNK_VALUES // max(1, cols))  # stored rows a band holds
    if per >= hd:  # whole heads
        step = per // hd
        for h in range(0, rows // hd, step):
            n = min(step, rows // hd - h)
            view[h:h + n] = dequantize(raw[h * hd * row:(h + n) * hd * row], ggml, (n * hd, cols),
                                       out_dtype).reshape(n, half, 2, cols)
    else:  # row pairs of one head
        pairs = max(1, per // 2)
        for h in range(rows // hd):
            for i in range(0, half, pairs):
                n = min(pairs, half - i)
                a = (h * hd + 2 * i) * row
                view[h, i:i + n] = dequantize(raw[a:a + 2 * n * row], ggml, (2 * n, cols), out_dtype).reshape(n, 2, cols)
    return out.reshape(-1).view(np.uint8)
