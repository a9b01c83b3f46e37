"""What `--verify` holds on the host: Plan -> its read chunk and its peak bytes.

`--verify` runs after the load, once the ring is released. It compares part by part, a chunk at a
time: a copy or a conversion reads at most `verify_chunk(plan)` bytes of source at a time, an FP8
dequantization at most that many weight bytes (rows of one scale band, or columns of a row) with
its whole scale grid, a GGUF dequantization whole rows of blocks up to that many bytes; a transpose and an FP4 dequantization need their whole source. Each chunk
holds its read bytes, the reference computed from them (and a conversion's intermediate, and the
chunk scratch of `planc.plan.hostcost`), the device bytes copied back, and the comparison's mask (one
byte per byte compared).

The chunk follows the plan's host budget (an eighth of it, between 64 KiB and 16 MiB), so a plan
admitted under a small budget verifies in small reads; `verify_host_bytes` is the largest part's
figure, which `explain` shows and the executor checks against the live room before allocating.
"""

from __future__ import annotations

from ..base.dtypes import DTYPES
from .hostcost import scratch_bytes

MIN_CHUNK, MAX_CHUNK = 64 << 10, 16 << 20


def verify_chunk(plan) -> int:
    return max(MIN_CHUNK, min(MAX_CHUNK, plan.budget.host_bytes // 8))


def gguf_rows(p, chunk: int) -> int:
    """The rows of blocks one verification step of gguf part `p` reads: as many whole rows as `chunk`
    bytes hold (at least one), whole heads where the part unpermutes (a head's rows move among
    themselves), at most the part's."""
    rows, row = p.inputs[0].shape
    n = max(1, chunk // max(1, row))
    if p.unpermute:
        n = max(1, n // p.unpermute) * p.unpermute
    return min(rows, n)


def part_bytes(p, chunk: int) -> int:
    """Host bytes the verification of part `p` holds at most with reads of `chunk` bytes."""
    w = p.inputs[0]
    s_size = max(1, DTYPES[w.dtype].bits // 8)
    d_size = max(1, DTYPES[p.out_dtype].bits // 8)
    scratch = scratch_bytes("convert", w.dtype, p.out_dtype, p.out_bytes, d_size)
    zero = min(p.zero_bytes, chunk)  # the padding is checked a chunk at a time
    if p.op in ("copy", "convert"):
        src = min(w.nbytes, max(s_size, chunk // s_size * s_size))
        out = src // s_size * d_size
        conv = (out + scratch) if p.op == "convert" else 0
        return max(src + conv + 2 * out, zero)
    reads = sum(i.nbytes for i in p.inputs)
    if p.op == "gguf":  # whole rows of blocks at a time, dequantized by the host reference
        rows, row = w.shape
        n = gguf_rows(p, chunk)
        return max(n * row + 3 * n * (p.out_bytes // max(1, rows)) + scratch, zero)
    if p.op == "dequantize" and len(p.inputs) == 2 and len(w.shape) == 2 and w.dtype.startswith("F8"):
        rows, cols = w.shape
        band = min(w.nbytes, max(min(cols, chunk), chunk // max(1, cols) * cols))
        return max(p.inputs[1].nbytes + band + 3 * band * d_size + scratch, zero)
    # a transpose (and its conversion) or an FP4 dequantization: the whole source, the reference
    # (and a converted copy), the device bytes, the mask
    conv = p.out_bytes if (p.op == "transpose" and w.dtype != p.out_dtype) else 0
    return max(reads + conv + 3 * p.out_bytes + scratch, zero)


def verify_host_bytes(plan) -> int:
    chunk = verify_chunk(plan)
    return max((part_bytes(p, chunk) for p in plan.parts), default=0)
