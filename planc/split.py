"""Tensor-parallel slicing: which bytes of a source tensor belong to one rank.

A rank's slice of dim d of a row-major tensor of shape S is, in bytes, `count` segments of `seg`
bytes, `stride` bytes apart, the first at `start`:
  outer = prod(S[:d]), inner = prod(S[d+1:]) * itemsize
  seg = (stop - begin) * inner, stride = S[d] * inner, count = outer, start += begin * inner
A dim-0 slice (or any slice whose outer dims are all 1) is one contiguous range. A dim-1 slice of
a [R, C] weight is one segment per row: the compiler reads the segments, and coalescing within
`io.merge_gap` decides whether that is many small reads or whole rows sliced on the device.

Example: [4, 6] BF16 at file offset 100, ranks 2, dim 1, rank 1: inner = 2, D = 6, per = 3,
begin = 3 -> start 106, seg 6, stride 12, count 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .dtypes import DTYPES
from .errors import BindError
from .codes import Code


@dataclass(frozen=True)
class Slice:
    """A range of one source dim: [start, stop). `pad` elements of that dim are zero-filled after it."""

    dim: int
    start: int
    stop: int
    pad: int = 0


@dataclass(frozen=True)
class Ranged:
    """A slice of a tensor as file bytes."""

    start: int
    seg: int
    stride: int
    count: int
    shape: tuple[int, ...]  # the slice's shape

    @property
    def nbytes(self) -> int:
        return self.seg * self.count


def rank_range(size: int, world: int, rank: int, pad: bool, what: str, dim: int,
               can_pad: bool = True) -> tuple[int, int, int]:
    """(start, stop, per_rank) of `rank` over a dim of `size`. Uneven sizes need `pad`, which is
    offered in the error only where it is accepted: dim 0 of a single tensor (`can_pad`)."""
    if size % world == 0:
        per = size // world
        return rank * per, (rank + 1) * per, per
    if not pad:
        fix = ("allow zero padding with split: {dim: 0, pad: true}" if dim == 0 and can_pad else
               f"use a tensor_parallel.size that divides {size}, split another dim, or replicate it (split: replicate)")
        raise BindError(f"{what}: dim {dim} has size {size}, not divisible by tensor_parallel.size {world}; {fix}",
                        code=Code.SPLIT_UNEVEN)
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per), per


def ranged(start: int, shape: tuple[int, ...], dtype: str, sl: Slice | None) -> Ranged:
    """The file bytes of `sl` of a tensor at `start` with `shape` and `dtype`."""
    item = DTYPES[dtype].bits
    if sl is None:
        n = DTYPES[dtype].nbytes(math.prod(shape)) or 0
        return Ranged(start, n, n, 1, tuple(shape))
    if item % 8:
        raise BindError(f"cannot split a {dtype} tensor (sub-byte elements)", code=Code.SPLIT_SUBBYTE)
    d = sl.dim
    inner = math.prod(shape[d + 1:]) * item // 8
    outer = math.prod(shape[:d])
    seg = (sl.stop - sl.start) * inner
    out_shape = (*shape[:d], sl.stop - sl.start, *shape[d + 1:])
    if outer == 1 or seg == 0:
        return Ranged(start + sl.start * inner, seg * outer, seg * outer, 1, out_shape)
    return Ranged(start + sl.start * inner, seg, shape[d] * inner, outer, out_shape)
