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

A block-quantized GGUF tensor (Q8_0, Q4_K, ...) stores each row (its last dim) as whole blocks of
B elements, `block_bytes` each (`ranged_blocks`): a slice of an outer dim takes whole rows, as
above with a row's bytes for `inner`; a slice of the last dim must start and stop on block
boundaries (each rank's columns whole blocks), else it would cut a block, whose elements share one
scale, and it is refused (`split-gguf-block`) with the block size and the sizes that would divide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..base.dtypes import DTYPES
from ..base.errors import BindError
from ..base.codes import Code


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


class Rows(NamedTuple):
    """Rows `first`, `first + step`, ... (`count` of them) of a tensor's outer dim, packed in order:
    a row gather (GGUF q/k rows in transformers' order, `planc.manifest.gguf_names.unpermute_rows`)."""

    first: int
    step: int
    count: int


def rows_ranged(start: int, shape: tuple[int, ...], row_bytes: int, g: Rows) -> Ranged:
    """The file bytes of row gather `g` of a tensor at `start` whose rows (dim 0) are `row_bytes` each."""
    first = start + g.first * row_bytes
    out_shape = (g.count, *shape[1:])
    if g.count == 1 or g.step == 1:
        return Ranged(first, row_bytes * g.count, row_bytes * g.count, 1, out_shape)
    return Ranged(first, row_bytes, g.step * row_bytes, g.count, out_shape)


def ranged(start: int, shape: tuple[int, ...], dtype: str, sl: Slice | None) -> Ranged:
    """The file bytes of `sl` of a tensor at `start` with `shape` and `dtype`."""
    if dtype not in DTYPES:
        from ..manifest.ggml_types import quant_type

        qt = quant_type(dtype)
        if qt is not None:
            return ranged_blocks(start, shape, qt, sl)
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


def ranged_blocks(start: int, shape: tuple[int, ...], qt, sl: Slice | None, what: str = "") -> Ranged:
    """The file bytes of `sl` of a block-quantized GGUF tensor (`qt` its `GGMLType`) at `start`:
    rows of whole blocks along the last dim. A slice of the last dim off block boundaries is refused."""
    cols = shape[-1]
    if cols % qt.block:
        raise BindError(f"{what or 'a ' + qt.name + ' tensor'} {list(shape)}: rows of {cols} elements are not whole "
                        f"{qt.name} blocks of {qt.block}", code=Code.GGUF_BAD_SHAPE)
    row = cols // qt.block * qt.block_bytes
    rows = math.prod(shape[:-1])
    if sl is None:
        return Ranged(start, rows * row, rows * row, 1, tuple(shape))
    d = sl.dim
    out_shape = (*shape[:d], sl.stop - sl.start, *shape[d + 1:])
    if d == len(shape) - 1:
        if sl.start % qt.block or sl.stop % qt.block:
            blocks = cols // qt.block
            raise BindError(f"{what or 'a ' + qt.name + ' tensor'} {list(shape)}: a rank's columns "
                            f"[{sl.start}, {sl.stop}) of dim {d} would cut a {qt.name} block ({qt.block} elements "
                            f"sharing one scale); each rank needs whole blocks: a tensor_parallel.size that divides "
                            f"{blocks} (its {cols} columns are {blocks} blocks), a split of dim 0, or replicate",
                            code=Code.SPLIT_GGUF_BLOCK)
        seg = (sl.stop - sl.start) // qt.block * qt.block_bytes
        first = start + sl.start // qt.block * qt.block_bytes
        if rows == 1 or seg == 0:
            return Ranged(first, seg * rows, seg * rows, 1, out_shape)
        return Ranged(first, seg, row, rows, out_shape)
    inner = math.prod(shape[d + 1:-1]) * row
    outer = math.prod(shape[:d])
    seg = (sl.stop - sl.start) * inner
    if outer == 1 or seg == 0:
        return Ranged(start + sl.start * inner, seg * outer, seg * outer, 1, out_shape)
    return Ranged(start + sl.start * inner, seg, shape[d] * inner, outer, out_shape)
