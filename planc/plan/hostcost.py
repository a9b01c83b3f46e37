"""Host-path transform scratch: Part fields -> the bytes of numpy temporaries a host transform holds.

A host-path transform (a conversion, an FP8 or FP4 dequantization, a conversion before a transpose)
works a bounded chunk of at most `CHUNK_VALUES` output values at a time, so its float32
temporaries never grow with the tensor. Each value of a chunk holds at most `SCRATCH_PER_VALUE`
bytes of temporaries at once (FP8: the decoded float32, its scale and their product, then the
rounded target; FP4: the decoded pairs, the product, its NaN mask and the rounded target), and the
plan counts `scratch_bytes` of them in the part's host bytes (its normalize step, or the pack
step of a transpose with a conversion), beside the read buffers and the output. A pure transpose
and a pure copy hold no scratch.

Tests hold the measured peak of every host transform (tracemalloc) to the part's counted bytes.
This module imports nothing heavy: the graph, the plan checks and the executors use it.
"""

from __future__ import annotations

CHUNK_VALUES = 1 << 16  # output values a host transform works at a time
SCRATCH_PER_VALUE = 24  # bytes of temporaries per value of a chunk, at most


def scratch_bytes(op: str, in_dtype: str, out_dtype: str, out_bytes: int, itemsize: int) -> int:
    """Scratch a host-path part holds beyond its reads and output (`itemsize`: bytes per output value)."""
    if op == "copy" or (op == "transpose" and in_dtype == out_dtype) or itemsize <= 0:
        return 0
    return min(out_bytes // itemsize, CHUNK_VALUES) * SCRATCH_PER_VALUE
