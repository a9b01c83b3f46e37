"""build_graph: Binding -> `Graph`: one `ir.Part` per placed tensor part, with its path and costs.

Each part takes one of two paths:
- direct: its bytes are read into pinned ring slots and copied to the device, either to their final
  place (a pure copy, or a conversion between same-size types done in place afterwards) or to a
  landing buffer that a kernel converts, dequantizes or transposes into the final place. Host
  cost: the ring alone.
- host: the rule asks for `on: host` and there is work to do. The bytes are read into an owned
  buffer, transformed into host scratch, then staged through the ring.

The steps of each part (read, normalize, pack, stage) and their costs are derived from the part
by `ir.part_steps`, so the step DAG that admission replays cannot disagree with the parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter

from .bind import Binding, Placement
from .bind import Part as BoundPart
from ..plan.records import Input, Part
from ..base.dtypes import DTYPES
from ..plan.hostcost import scratch_bytes
from .split import Rows, ranged, rows_ranged

_tuple_new = tuple.__new__  # builds a NamedTuple from a sequence without a Python-level call


@dataclass(frozen=True)
class Graph:
    placements: tuple[Placement, ...]
    parts: tuple[Part, ...]  # in schedule order (file, offset); dst_offset not yet set


def build_graph(binding: Binding) -> Graph:
    keyed = []
    for pl in binding.placements:
        for k, part in enumerate(pl.parts):
            inputs = _inputs(part)
            keyed.append(((inputs[0].file, inputs[0].start, pl.name, k), pl, k, part, inputs))
    keyed.sort(key=itemgetter(0))  # (file, offset, tensor, part index)
    nodes = tuple(_part_node(i, pl, k, part, inputs) for i, (_, pl, k, part, inputs) in enumerate(keyed))
    return Graph(binding.placements, nodes)


def _input(role: str, t, sl) -> Input:
    if isinstance(sl, Rows):
        return _rows_input(role, t, sl)
    if t.dtype not in DTYPES:  # GGUF blocks: read as U8 rows of whole blocks
        return _blocks_input(role, t, sl)
    if sl is None:  # the whole tensor: what `ranged` gives, without building it
        # The manifest reader refuses an entry whose bytes are not dtype x shape: t.nbytes is them.
        n = t.nbytes
        return _tuple_new(Input, (role, t.name, t.file, t.start, n, t.dtype, tuple(t.shape), n, n, 1))
    g = ranged(t.start, t.shape, t.dtype, sl)
    return Input(role, t.name, t.file, g.start, g.nbytes, t.dtype, g.shape, g.seg, g.stride, g.count)


def _blocks_input(role: str, t, sl) -> Input:
    """A block-quantized GGUF tensor (or its rank's slice, `split.ranged_blocks`) as U8 rows: one row
    per row of the (slice's) shape, each its whole blocks."""
    from ..manifest.ggml_types import quant_type

    qt = quant_type(t.dtype)
    g = ranged(t.start, t.shape, t.dtype, sl)
    shape = (math.prod(g.shape[:-1]), g.shape[-1] // qt.block * qt.block_bytes)
    return Input(role, t.name, t.file, g.start, g.nbytes, "U8", shape, g.seg, g.stride, g.count)


def _rows_input(role: str, t, g: Rows) -> Input:
    """A row gather of a tensor (rows `g.first`, `+ g.step`, ...): one strided input."""
    from ..manifest.ggml_types import quant_type

    qt = quant_type(t.dtype) if t.dtype not in DTYPES else None
    inner = math.prod(t.shape[1:])
    row = inner // qt.block * qt.block_bytes if qt is not None else DTYPES[t.dtype].nbytes(inner)
    r = rows_ranged(t.start, t.shape, row, g)
    shape, dtype = ((g.count, row), "U8") if qt is not None else (r.shape, t.dtype)
    return Input(role, t.name, t.file, r.start, r.nbytes, dtype, shape, r.seg, r.stride, r.count)


def _inputs(part: BoundPart) -> tuple[Input, ...]:
    w = _input("weight", part.source, part.src_slice)
    if part.scale is None:
        return (w,)
    if len(part) > 7 and part.scale2 is not None:
        return (w, _input("scale", part.scale, part.scale_slice), _input("scale2", part.scale2, None))
    return (w, _input("scale", part.scale, part.scale_slice))


def _part_node(pid: int, pl: Placement, k: int, part: BoundPart, inputs: tuple[Input, ...]) -> Part:
    src = part.source
    in_bytes = inputs[0].nbytes if len(inputs) == 1 else sum(i.nbytes for i in inputs)
    if pl.op == "copy":
        path, reason, landing, host = "direct", "pure copy into the final place", 0, 0
    elif pl.on == "host":
        path, reason, landing = "host", _reason("host", pl.rule), 0
        host = (in_bytes + part.out_bytes * (2 if pl.op == "transpose" and src.dtype != pl.dtype else 1)
                + scratch_bytes(pl.op, src.dtype, pl.dtype, part.out_bytes, DTYPES[pl.dtype].itemsize))
    elif pl.op == "convert" and DTYPES[src.dtype].bits == DTYPES[pl.dtype].bits:
        path, landing, host = "direct", 0, 0
        reason = _reason("in place", f"adding {pl.add:g}" if pl.add else "")
    else:
        what = f"{pl.op} adding {pl.add:g}" if pl.add else f"{pl.op} into transformers' row order" if pl.unpermute \
            else pl.op
        path, reason, landing, host = "direct", _reason("landing", what), in_bytes, 0
    return _tuple_new(Part, (pid, pl.name, k, pl.op, path, reason, inputs, part.offset_bytes, part.out_bytes,
                             pl.dtype, landing, host, pl.block, part.zero_bytes, pl.ggml and src.dtype, pl.add,
                             pl.unpermute, -1))


# Notes and reasons repeat across tens of thousands of steps and parts: one string each.
@lru_cache(maxsize=None)
def _reason(path: str, what) -> str:
    if path == "host":
        return f"rules[{what}] asks for on: host"
    if path == "in place":
        return f"same-size conversion{f' ({what})' if what else ''} runs in place on the device"
    return f"{what} on the device from a landing buffer"
