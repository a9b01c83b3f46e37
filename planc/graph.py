"""build_graph: Binding -> `Graph`: one `PartNode` per placed tensor part, and the step DAG.

Each part takes one of two paths:
- direct: its bytes are read into pinned ring slots and copied to the device, either to their final
  place (a pure copy, or a conversion between same-size types done in place afterwards) or to a
  landing buffer that a kernel converts, dequantizes or transposes into the final place. Host
  cost: the ring alone.
- host: the rule asks for `on: host` and there is work to do. The bytes are read into an owned
  buffer, transformed into host scratch, then staged through the ring.

Steps per part (networkx DiGraph, acyclic): read (one per input: weight, scale), normalize
(conversion or dequantization), pack (transpose, or fuse/stack placement by offset), stage.
On the direct path stage comes before normalize/pack (they run on the device); on the host path
after. Costs: host bytes a step holds while its run is in flight, device bytes it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .bind import Binding, Part, Placement
from .dtypes import DTYPES
from .split import ranged


@dataclass(frozen=True)
class Input:
    """The bytes read from a checkpoint file for a part: `count` segments of `seg` bytes, `stride` apart.

    A whole tensor, or a tensor-parallel slice of its leading dim, is one segment; a slice of a later
    dim is one segment per outer index. `shape` is the shape of what is read (the slice).
    """

    role: str  # weight | scale
    tensor: str
    file: str
    start: int
    nbytes: int  # seg * count
    dtype: str
    shape: tuple[int, ...]
    seg: int = 0
    stride: int = 0
    count: int = 1

    def segments(self):
        """(file offset, bytes, offset within the read bytes) of each segment."""
        seg = self.seg if self.count > 1 else self.nbytes
        for k in range(self.count):
            yield self.start + k * self.stride, seg, k * seg


@dataclass(frozen=True)
class PartNode:
    id: int
    placement: str  # output tensor name
    index: int  # part index within the placement
    op: str
    path: str  # direct | host
    reason: str
    inputs: tuple[Input, ...]
    offset_bytes: int  # within the placed tensor
    out_bytes: int
    out_dtype: str
    landing_bytes: int  # device bytes of landing buffers (direct path, kernel not in place)
    host_bytes: int  # owned read buffer + scratch (host path)
    block: int
    zero_bytes: int = 0  # zero padding after out_bytes (uneven tensor-parallel split)

    @property
    def read_bytes(self) -> int:
        return sum(i.nbytes for i in self.inputs)

    @property
    def sort_key(self):
        w = self.inputs[0]
        return (w.file, w.start, self.placement, self.index)


@dataclass(frozen=True)
class Step:
    id: str
    kind: str  # read | normalize | pack | stage
    part: int
    tensor: str
    host_bytes: int
    device_bytes: int
    note: str


@dataclass(frozen=True)
class Graph:
    placements: tuple[Placement, ...]
    parts: tuple[PartNode, ...]  # in schedule order (file, offset)
    steps: tuple[Step, ...]
    dag: nx.DiGraph


def build_graph(binding: Binding) -> Graph:
    nodes = []
    for pl in binding.placements:
        for k, part in enumerate(pl.parts):
            nodes.append(_part_node(pl, k, part))
    nodes.sort(key=lambda n: n.sort_key)
    nodes = [PartNode(**{**n.__dict__, "id": i}) for i, n in enumerate(nodes)]
    steps, dag = [], nx.DiGraph()
    for n in nodes:
        for s, deps in _steps(n):
            steps.append(s)
            dag.add_node(s.id, kind=s.kind, part=n.id)
            for d in deps:
                dag.add_edge(d, s.id)
    assert nx.is_directed_acyclic_graph(dag)
    return Graph(binding.placements, tuple(nodes), tuple(steps), dag)


def _input(role: str, t, sl) -> Input:
    g = ranged(t.start, t.shape, t.dtype, sl)
    return Input(role, t.name, t.file, g.start, g.nbytes, t.dtype, g.shape, g.seg, g.stride, g.count)


def _part_node(pl: Placement, k: int, part: Part) -> PartNode:
    src = part.source
    inputs = [_input("weight", src, part.src_slice)]
    if part.scale is not None:
        inputs.append(_input("scale", part.scale, part.scale_slice))
    in_bytes = sum(i.nbytes for i in inputs)
    if pl.op == "copy":
        path, reason, landing, host = "direct", "pure copy into the final place", 0, 0
    elif pl.on == "host":
        path, reason, landing = "host", f"rules[{pl.rule}] asks for on: host", 0
        host = in_bytes + part.out_bytes * (2 if pl.op == "transpose" and src.dtype != pl.dtype else 1)
    elif pl.op == "convert" and DTYPES[src.dtype].bits == DTYPES[pl.dtype].bits:
        path, reason, landing, host = "direct", "same-size conversion runs in place on the device", 0, 0
    else:
        path, reason, landing, host = "direct", f"{pl.op} on the device from a landing buffer", in_bytes, 0
    return PartNode(0, pl.name, k, pl.op, path, reason, tuple(inputs), part.offset_bytes, part.out_bytes,
                    pl.dtype, landing, host, pl.block, part.zero_bytes)


def _steps(n: PartNode):
    p = f"{n.placement}#{n.index}"
    reads = []
    for inp in n.inputs:
        sid = f"read:{p}:{inp.role}"
        hb = inp.nbytes if n.path == "host" else 0
        reads.append(Step(sid, "read", n.id, n.placement, hb, 0, f"{inp.file}@{inp.start}+{inp.nbytes}"))
    out = [(s, []) for s in reads]
    read_ids = [s.id for s in reads]
    transform = n.op in ("convert", "dequantize")
    packs = n.op == "transpose" or n.index > 0 or n.offset_bytes > 0
    stage = Step(f"stage:{p}", "stage", n.id, n.placement, 0, n.out_bytes, "pinned ring -> device")
    if n.path == "host":
        prev = read_ids
        if transform:
            norm = Step(f"normalize:{p}", "normalize", n.id, n.placement, n.out_bytes, 0, f"{n.op} on host")
            out.append((norm, prev))
            prev = [norm.id]
        if n.op == "transpose":
            extra = n.host_bytes - n.read_bytes - (n.out_bytes if transform else 0)
            pack = Step(f"pack:{p}", "pack", n.id, n.placement, extra, 0, "transpose on host")
            out.append((pack, prev))
            prev = [pack.id]
        out.append((stage, prev))
        return out
    out.append((stage, read_ids))
    prev = [stage.id]
    if transform:
        where = "in place" if n.landing_bytes == 0 else "landing buffer"
        norm = Step(f"normalize:{p}", "normalize", n.id, n.placement, 0, n.landing_bytes, f"{n.op} on device ({where})")
        out.append((norm, prev))
        prev = [norm.id]
    if packs:
        landing = n.landing_bytes if n.op == "transpose" else 0
        note = "transpose on device" if n.op == "transpose" else "placed by offset (no scratch)"
        out.append((Step(f"pack:{p}", "pack", n.id, n.placement, 0, landing, note), prev))
    return out
