"""build_graph: Binding -> `Graph`: one `PartNode` per placed tensor part, and the step DAG.

Each part takes one of two paths:
- direct: its bytes are read into pinned ring slots and copied to the device, either to their final
  place (a pure copy, or a conversion between same-size types done in place afterwards) or to a
  landing buffer that a kernel converts, dequantizes or transposes into the final place. Host
  cost: the ring alone.
- host: the rule asks for `on: host` and there is work to do. The bytes are read into an owned
  buffer, transformed into host scratch, then staged through the ring.

Steps per part, each listing the steps it waits for (acyclic: only steps emitted before it): read
(one per input: weight, scale), normalize (conversion or dequantization), pack (transpose, or
fuse/stack placement by offset), stage.
On the direct path stage comes before normalize/pack (they run on the device); on the host path
after. Costs: host bytes a step holds while its run is in flight, device bytes it holds.

A step is a dict in the form the plan lists it: {id, kind, part, host_bytes, device_bytes, note,
deps}, deps being the sorted ids of the steps it waits for. A plan has several steps per part
(hundreds of thousands for a large MoE), so they are built once, in that form, and only when first
asked for: scheduling and admission need the parts, not the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from math import prod
from operator import itemgetter
from typing import NamedTuple

from .bind import Binding, Part, Placement
from .dtypes import DTYPES
from .split import ranged


class Input(NamedTuple):
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


class PartNode(NamedTuple):
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
        inputs = self.inputs
        return inputs[0].nbytes if len(inputs) == 1 else sum(i.nbytes for i in inputs)

    @property
    def sort_key(self):
        w = self.inputs[0]
        return (w.file, w.start, self.placement, self.index)


@dataclass(frozen=True)
class Graph:
    placements: tuple[Placement, ...]
    parts: tuple[PartNode, ...]  # in schedule order (file, offset)

    @cached_property
    def steps(self) -> tuple[dict, ...]:
        """Every part's steps, in part order; each after the steps it waits for."""
        steps = []
        for n in self.parts:
            ps = _steps(n)
            # A step waits only for steps of its own part emitted before it, so emission order is a
            # topological order: the graph is acyclic by construction, checked here in passing.
            done = []
            for s in ps:
                for d in s["deps"]:
                    assert d in done, s["id"]
                done.append(s["id"])
            steps += ps
        return tuple(steps)

    @cached_property
    def dag(self):
        """The steps as a networkx DiGraph (node attributes kind and part), built on first use."""
        import networkx as nx

        dag = nx.DiGraph()
        for s in self.steps:
            dag.add_node(s["id"], kind=s["kind"], part=s["part"])
            dag.add_edges_from((d, s["id"]) for d in s["deps"])
        return dag


def build_graph(binding: Binding) -> Graph:
    keyed = []
    for pl in binding.placements:
        for k, part in enumerate(pl.parts):
            inputs = _inputs(part)
            keyed.append(((inputs[0].file, inputs[0].start, pl.name, k), pl, k, part, inputs))
    keyed.sort(key=itemgetter(0))  # PartNode.sort_key
    nodes = tuple(_part_node(i, pl, k, part, inputs) for i, (_, pl, k, part, inputs) in enumerate(keyed))
    return Graph(binding.placements, nodes)


def _input(role: str, t, sl) -> Input:
    if sl is None:  # the whole tensor: what `ranged` gives, without building it
        n = DTYPES[t.dtype].nbytes(prod(t.shape)) or 0
        return Input(role, t.name, t.file, t.start, n, t.dtype, tuple(t.shape), n, n, 1)
    g = ranged(t.start, t.shape, t.dtype, sl)
    return Input(role, t.name, t.file, g.start, g.nbytes, t.dtype, g.shape, g.seg, g.stride, g.count)


def _inputs(part: Part) -> tuple[Input, ...]:
    w = _input("weight", part.source, part.src_slice)
    if part.scale is None:
        return (w,)
    return (w, _input("scale", part.scale, part.scale_slice))


def _part_node(pid: int, pl: Placement, k: int, part: Part, inputs: tuple[Input, ...]) -> PartNode:
    src = part.source
    in_bytes = inputs[0].nbytes if len(inputs) == 1 else sum(i.nbytes for i in inputs)
    if pl.op == "copy":
        path, reason, landing, host = "direct", "pure copy into the final place", 0, 0
    elif pl.on == "host":
        path, reason, landing = "host", _reason("host", pl.rule), 0
        host = in_bytes + part.out_bytes * (2 if pl.op == "transpose" and src.dtype != pl.dtype else 1)
    elif pl.op == "convert" and DTYPES[src.dtype].bits == DTYPES[pl.dtype].bits:
        path, reason, landing, host = "direct", "same-size conversion runs in place on the device", 0, 0
    else:
        path, reason, landing, host = "direct", _reason("landing", pl.op), in_bytes, 0
    return PartNode(pid, pl.name, k, pl.op, path, reason, inputs, part.offset_bytes, part.out_bytes,
                    pl.dtype, landing, host, pl.block, part.zero_bytes)


def _step(sid: str, kind: str, part: int, host_bytes: int, device_bytes: int, note: str, deps: tuple) -> dict:
    return {"id": sid, "kind": kind, "part": part, "host_bytes": host_bytes, "device_bytes": device_bytes,
            "note": note, "deps": deps}


def _steps(n: PartNode) -> list[dict]:
    p = f"{n.placement}#{n.index}"
    pid, op = n.id, n.op
    host = n.path == "host"
    out = [_step(f"read:{p}:{inp.role}", "read", pid, inp.nbytes if host else 0, 0,
                 f"{inp.file}@{inp.start}+{inp.nbytes}", ()) for inp in n.inputs]
    prev = (out[0]["id"],) if len(out) == 1 else tuple(sorted([s["id"] for s in out]))
    transform = op in ("convert", "dequantize")
    if host:
        if transform:
            out.append(_step(f"normalize:{p}", "normalize", pid, n.out_bytes, 0, f"{op} on host", prev))
            prev = (out[-1]["id"],)
        if op == "transpose":
            extra = n.host_bytes - n.read_bytes - (n.out_bytes if transform else 0)
            out.append(_step(f"pack:{p}", "pack", pid, extra, 0, "transpose on host", prev))
            prev = (out[-1]["id"],)
        out.append(_step(f"stage:{p}", "stage", pid, 0, n.out_bytes, "pinned ring -> device", prev))
        return out
    out.append(_step(f"stage:{p}", "stage", pid, 0, n.out_bytes, "pinned ring -> device", prev))
    prev = (out[-1]["id"],)
    if transform:
        out.append(_step(f"normalize:{p}", "normalize", pid, 0, n.landing_bytes,
                         _device_note(op, n.landing_bytes == 0), prev))
        prev = (out[-1]["id"],)
    if op == "transpose" or n.index > 0 or n.offset_bytes > 0:
        landing = n.landing_bytes if op == "transpose" else 0
        note = "transpose on device" if op == "transpose" else "placed by offset (no scratch)"
        out.append(_step(f"pack:{p}", "pack", pid, 0, landing, note, prev))
    return out


# Notes and reasons repeat across tens of thousands of steps and parts: one string each.
@lru_cache(maxsize=None)
def _device_note(op: str, in_place: bool) -> str:
    return f"{op} on device ({'in place' if in_place else 'landing buffer'})"


@lru_cache(maxsize=None)
def _reason(path: str, what) -> str:
    return f"rules[{what}] asks for on: host" if path == "host" else f"{what} on the device from a landing buffer"
