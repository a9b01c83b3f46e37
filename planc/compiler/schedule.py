"""schedule: Graph + io settings -> `Schedule`: device layout, runs, read requests and copies.

- Order: parts by (file, offset) of their first input.
- Device layout: one arena; tensors laid out in read order, each aligned to its item size, so that
  tensors adjacent in the file are adjacent on the device and their copies coalesce.
- Runs: the order cut into runs of at most `io.run` read bytes (a part larger than that is a run
  of its own).
- Requests: within a run, direct-path inputs of one file whose gap is at most `io.merge_gap` join
  one extent; the extent is widened to 4 KiB boundaries (O_DIRECT) and cut on the file's slot
  grid (file offsets that are multiples of `io.slot`), so a request holds whole slot-grid cells
  but at an extent's ends: a digest leaf that divides the slot lies inside one request unless an
  extent ends in it (`planc.manifest.digestcheck`). A request is one `preadv` into one ring slot.
- Strided inputs (a rank's slice of a later dim: `count` segments `stride` apart) are read one of
  two ways, chosen per input by `costmodel.choose`: `mapped`, strided requests of as many whole
  segments as a slot holds, packed (one copy each: the slice's rows are contiguous on the device);
  or `rows`, the whole rows on the slot grid of their own extent, each request's full rows sent by
  one 2-D copy (row pitch in the slot -> packed) and a row cut by a slot boundary by 1-D copies.
- Copies: each request's bytes go to the device as segments (slot range -> arena or landing
  range); neighbouring segments contiguous on both sides are one copy. Host-path parts stage their
  scratch through the ring in slot-sized copies.
- Landing: direct-path parts that convert out of place, dequantize or transpose land in a landing
  region; runs alternate between two regions (even runs, odd runs) so run k+1 can land while run
  k's kernels finish; run k+2 reuses run k's region after run k is done.

Worked example (slot 8 KiB, merge_gap 1 KiB): tensors a [0, 3000) and b [3500, 9000) in one file
form one extent [0, 9000), widened to [0, 12288) -> requests [0, 8192) and [8192, 12288) carrying
3 copies (a, b's head, b's tail): 2 requests and 3 copies, against 3 and 3 had each tensor been read
alone. Had b started at 3000 and been adjacent to a in the arena, a and b's head would be one copy.
An extent [12288, 20000) is cut on the grid: [12288, 16384) and [16384, 20480).
"""

from __future__ import annotations

from collections import defaultdict

from dataclasses import dataclass
from operator import itemgetter

from ..plan import costs as costmodel
from ..base import fp4
from ..base.dtypes import DTYPES
from ..base.formats import kernel_format
from .graph import Graph
from ..plan.records import Copy, Costs, HostPart, Kernel, Part, Request, Run, Tensor
from ..spec.model import DIRECT_ALIGN, IO

_FILE_START = itemgetter(0, 1)  # sort key of (file, start, ...) tuples
_tuple_new = tuple.__new__  # builds a NamedTuple from a sequence without a Python-level call
_ITEMSIZE = {name: max(1, d.itemsize) for name, d in DTYPES.items()}  # the alignment of each dtype

# A request whose bytes go to this many separate device places or more is copied whole into a
# device staging slot and scattered by one kernel: one copy and one launch instead of many copies.
SCATTER_MIN_COPIES = 4


@dataclass(frozen=True)
class Schedule:
    io: IO
    tensors: tuple[Tensor, ...]  # sorted by name
    parts: tuple[Part, ...]  # the graph's parts with their arena offsets
    arena_bytes: int
    landing_region_bytes: tuple[int, int]  # (even runs, odd runs)
    ring_bytes: int
    runs: tuple[Run, ...]
    staging_bytes: int = 0  # device staging slots for scattered requests
    scatter_segments: int = 0  # rows of the scatter table (uploaded once: one copy)
    zero: tuple = ()  # (arena offset, bytes) zero-filled on the device before the load (padding)
    map_bytes: int = 0  # file windows mapped at once by strided requests
    costs: Costs = costmodel.DEFAULTS

    @property
    def landing_bytes(self) -> int:
        return sum(self.landing_region_bytes)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def layout(graph: Graph) -> tuple[dict, int]:
    """Arena offsets per placement, in the order their first part is read."""
    first = {}
    for n in graph.parts:
        first.setdefault(n.tensor, n.id)
    by_name = {p.name: p for p in graph.placements}
    offsets, cursor = {}, 0
    for name in sorted(by_name, key=lambda nm: (first.get(nm, -1), nm)):
        pl = by_name[name]
        cursor = _align(cursor, max(1, DTYPES[pl.dtype].itemsize))
        offsets[name] = cursor
        cursor += pl.nbytes
    return offsets, cursor


def schedule(graph: Graph, io: IO, costs: Costs = costmodel.DEFAULTS) -> Schedule:
    offsets, arena = layout(graph)
    runs_parts = _cut_runs(graph.parts, io.run)
    runs = []
    for k, parts in enumerate(runs_parts):
        runs.append(_run(k, parts, offsets, io, costs))
    regions = (max((r.landing_bytes for r in runs if r.index % 2 == 0), default=0),
               max((r.landing_bytes for r in runs if r.index % 2 == 1), default=0))
    # The ring never has more slots than the plan has requests and host staging copies to fill them.
    users = sum(len(r.requests) + sum(h.copies for h in r.host_parts) for r in runs)
    ring = min(io.slots, users) * io.slot
    tensors = tuple(Tensor(p.name, p.dtype, tuple(p.shape), offsets[p.name], p.nbytes)
                    for p in sorted(graph.placements, key=lambda p: p.name))
    assert Part._fields[-1] == "dst_offset"
    parts = tuple([_tuple_new(Part, (*n[:-1], offsets[n.tensor] + n.offset_bytes)) for n in graph.parts])
    zero = tuple((n.dst_offset + n.out_bytes, n.zero_bytes) for n in parts if n.zero_bytes)
    runs, staging_slots, segments = _scatter(runs, io)
    maps = costmodel.map_bytes(io.workers, [costmodel.window_bytes(q.length, q.stride, q.count, io.map_window)
                                            for r in runs for q in r.requests if q.stride], io.map_lanes)
    return Schedule(io, tensors, parts, arena, regions, ring, tuple(runs), staging_slots * io.slot, segments, zero,
                    maps, costs)


def _scatter(runs: list[Run], io: IO) -> tuple[list[Run], int, int]:
    """Mark requests with many arena copies for scatter; they share one device staging slot.

    The copy into the staging slot and the scatter kernel that reads it are on the load's one
    stream, so the next scattered request's copy starts only after the kernel that read the slot:
    stream order is the fence, and a second slot would only hold device memory (16 of them were a
    256 MiB share of a small MoE load's device peak).
    """
    count, segments, out = 0, 0, []
    for r in runs:
        reqs = []
        for q in r.requests:
            if (len(q.copies) >= SCATTER_MIN_COPIES and not q.stride
                    and all(c.space == "arena" and c.rows == 1 for c in q.copies)):
                width = _width(q.copies)
                q = Request(q.file, q.offset, q.length, q.copies, True, 0, width)
                count += 1
                segments += len(q.copies)
            reqs.append(q)
        out.append(r._replace(requests=tuple(reqs)))
    return out, min(count, 1), segments


def _width(copies) -> int:
    for w in (8, 4, 2):
        if all(c.slot_offset % w == 0 and c.dst_offset % w == 0 and c.nbytes % w == 0 for c in copies):
            return w
    return 1


def _cut_runs(parts, run_bytes: int) -> list[list[Part]]:
    runs, cur, cur_bytes = [], [], 0
    for n in parts:
        nbytes = n.read_bytes
        if cur and cur_bytes + nbytes > run_bytes:
            runs.append(cur)
            cur, cur_bytes = [], 0
        cur.append(n)
        cur_bytes += nbytes
    if cur:
        runs.append(cur)
    return runs


def _run(k: int, parts: list[Part], offsets: dict, io: IO, costs: Costs = costmodel.DEFAULTS) -> Run:
    segs, strided, kernels, host_parts, landed, landing = [], [], [], [], [], 0
    host_bytes = host_reads = host_segments = 0
    for n in parts:
        dst = offsets[n.tensor] + n.offset_bytes
        if n.path == "host":
            host_parts.append(HostPart(n.id, dst, -(-n.out_bytes // io.slot) if n.out_bytes else 0))
            host_bytes = max(host_bytes, n.host_bytes)  # host-path parts go one at a time
            host_reads += n.read_bytes
            host_segments += sum(i.count for i in n.inputs)
            continue
        if n.landing_bytes == 0:
            w = n.inputs[0]
            if w.count == 1:
                segs.append((w.file, w.start, w.nbytes, "arena", dst))
            else:
                strided.append((w, "arena", dst))
            if n.op == "convert" and n.out_bytes:  # a tensor of no elements has nothing to convert
                kernels.append(_kernel(n, "arena", dst, None, dst))
            continue
        landed.append((n, dst))
    # Landing offsets follow the file order of the inputs (not part order), each aligned to its
    # element size only, so that neighbours in the file stay neighbours in the landing region and
    # their copies coalesce.
    where = {}
    # An NVFP4 part's per-tensor scale lands right after its block scales (`fp4.scale2_offset`).
    order = sorted([(i.file, i.start, n, i) for n, _ in landed for i in n.inputs if i.role != "scale2"],
                   key=_FILE_START)
    for _, _, n, inp in order:
        a = _ITEMSIZE[inp.dtype]
        landing = -(-landing // a) * a
        where[(n.id, inp.role)] = landing
        if inp.count == 1:
            segs.append((inp.file, inp.start, inp.nbytes, "landing", landing))
        else:
            strided.append((inp, "landing", landing))
        landing += inp.nbytes
        if inp.role == "scale" and len(n.inputs) == 3:
            s2 = n.inputs[2]
            landing = fp4.scale2_offset(landing - inp.nbytes, inp.nbytes)
            segs.append((s2.file, s2.start, s2.nbytes, "landing", landing))
            landing += s2.nbytes
    for n, dst in landed:
        kernels.append(_kernel(n, "landing", where[(n.id, "weight")], where.get((n.id, "scale")), dst))
    requests, alone = _requests(segs, io)
    if strided:
        tiles, rest = _tiles(strided, io)
        extra = [q for inp, space, base in rest for q in _strided(inp, space, base, io, costs)]
        extra += [q for file, lo, hi, items in tiles for q in _rows_requests(file, lo, hi, items, io)]
        requests = tuple(sorted(requests + tuple(extra), key=_FILE_START))
        alone += sum(inp.count for inp, _, _ in strided)
    return Run(
        index=k,
        parts=tuple([n.id for n in parts]),
        requests=requests,
        kernels=_merged(kernels, {n.id: n.ggml for n in parts if n.op == "gguf"}),
        host_parts=tuple(host_parts),
        landing_region=k % 2,
        landing_bytes=landing,
        host_bytes=host_bytes,
        read_bytes=sum(r.length * r.count for r in requests) + host_reads,
        payload_bytes=sum(n.read_bytes for n in parts),
        requests_uncoalesced=alone + host_segments,
        copies_uncoalesced=alone + sum(h.copies for h in host_parts),
    )


def _strided(inp, space: str, base: int, io: IO, costs: Costs) -> list[Request]:
    """The requests of one strided input (`count` segments of `seg` bytes, `stride` apart), landing
    packed at `base` of `space`, read the way the cost model finds cheaper."""
    seg, stride, count, start, slot = inp.seg, inp.stride, inp.count, inp.start, io.slot
    how, _, _ = costmodel.choose(costs, seg, stride, count, slot, io.strided)
    out = []
    if how == "mapped":
        per = slot // seg
        for i in range(0, count, per):
            m = min(per, count - i)
            out.append(Request(inp.file, start + i * stride, seg, (Copy(0, space, base + i * seg, m * seg),),
                               stride=stride, count=m))
        return out
    return _rows_requests(inp.file, start, start + (count - 1) * stride + seg, [(inp, space, base)], io)


def _tiles(strided: list, io: IO) -> tuple[list, list]:
    """Strided inputs whose segments tile byte ranges of a file exactly, and the others.

    `k` inputs of `seg`-byte segments `stride = k * seg` apart, starting `seg` after one another
    (the two halves of each head of a GGUF q / k weight read in transformers' row order: a row
    every two rows, from the head's first row and from its second), together read every byte of
    `count * stride` bytes once: read as whole rows, they need no mapping and no byte twice, and one
    request serves them all. Tiles that touch join into one range. -> ([(file, lo, hi, [(input,
    space, base)])], [the other (input, space, base)]); none tiled when `io.strided` is `mapped`."""
    if io.strided == "mapped":
        return [], list(strided)
    groups: dict = defaultdict(list)
    for item in strided:
        w = item[0]
        groups[(w.file, w.seg, w.stride, w.count)].append(item)
    tiles, rest = [], []
    for (file, seg, stride, count), items in groups.items():
        items.sort(key=lambda it: it[0].start)
        k = stride // seg if seg and stride % seg == 0 else 0
        i = 0
        while i < len(items):
            grp = items[i:i + k] if k > 1 else []
            if len(grp) == k > 1 and all(grp[j][0].start == grp[0][0].start + j * seg for j in range(k)):
                tiles.append((file, grp[0][0].start, grp[0][0].start + count * stride, grp))
                i += k
            else:
                rest.append(items[i])
                i += 1
    tiles.sort(key=lambda t: (t[0], t[1]))
    joined: list = []
    for t in tiles:
        if joined and joined[-1][0] == t[0] and joined[-1][2] == t[1]:
            joined[-1] = (t[0], joined[-1][1], t[2], joined[-1][3] + t[3])
        else:
            joined.append(t)
    return joined, rest


def _rows_requests(file: str, lo: int, hi: int, inputs: list, io: IO) -> list[Request]:
    """Plain requests over file bytes [lo, hi) on the file's slot grid (aligned for O_DIRECT), each
    with the copies of the strided `inputs` (input, space, base) whose rows it holds: a 2-D copy of
    its whole rows, a 1-D copy of a row it holds a part of."""
    slot = io.slot
    a, e = lo // DIRECT_ALIGN * DIRECT_ALIGN, _align(hi, DIRECT_ALIGN)
    out = []
    for q, top in _grid(a, e, slot):
        copies = [c for inp, space, base in inputs for c in _row_copies(inp, space, base, q, top)]
        if copies:
            out.append(Request(file, q, top - q, tuple(sorted(copies, key=lambda c: c.slot_offset))))
    return out


def _row_copies(inp, space: str, base: int, q: int, hi: int) -> list[Copy]:
    """The copies of strided input `inp` (landing packed at `base` of `space`) out of request [q, hi)."""
    seg, stride, count, start = inp.seg, inp.stride, inp.count, inp.start
    first = max(0, (q - start - seg) // stride + 1)  # the first row ending after q
    last = min(count - 1, (hi - 1 - start) // stride)  # the last row starting before hi
    copies = []
    if first <= last:
        lo_full = first if start + first * stride >= q else first + 1
        hi_full = last if start + last * stride + seg <= hi else last - 1
        if lo_full > first:
            copies.append(_piece(q, hi, start + first * stride, seg, space, base + first * seg))
        if lo_full <= hi_full:
            rows = hi_full - lo_full + 1
            copies.append(Copy(start + lo_full * stride - q, space, base + lo_full * seg, seg,
                               rows, stride if rows > 1 else 0))
        if hi_full < last and (last > first or lo_full <= first):
            copies.append(_piece(q, hi, start + last * stride, seg, space, base + last * seg))
    return copies


def _piece(q: int, hi: int, row: int, seg: int, space: str, dst: int) -> Copy:
    """The part of the segment [row, row + seg) inside request [q, hi), as a 1-D copy."""
    lo, top = max(q, row), min(hi, row + seg)
    return Copy(lo - q, space, dst + (lo - row), top - lo)


def _merged(kernels: list, ggml: dict | None = None) -> tuple[Kernel, ...]:
    """Conversions whose sources and destinations lie end to end become one kernel (a stack of
    experts converted on load, or the head halves of an F16 q / k weight read in transformers' row
    order: one launch per tensor and run, not one per part); so do GGUF dequantizations of one GGML
    type and row width (`ggml`: part -> type) whose blocks lie end to end in the landing region and
    whose values lie end to end in the arena (a layer's q and k: one launch). Joined kernels share
    their `unpermute`: each part's rows are whole heads, so the rows of the joined kernel permute as
    each part's do.

    A run's kernels start once all its copies are done and write disjoint arena ranges, so their
    order within the run is free: kernels are sorted by source offset and neighbours joined."""
    ggml = ggml or {}
    conv = sorted((k.src_space, k.src_offset, i) for i, k in enumerate(kernels) if k.op in ("convert", "gguf"))
    out = {i: k for i, k in enumerate(kernels) if k.op not in ("convert", "gguf")}  # first kernel's index -> kernel
    last_i = None
    for _, _, i in conv:
        k, last = kernels[i], out.get(last_i)
        if last is None or (k.op, k.src_dtype, k.dst_dtype, k.src_space, k.add, k.unpermute) != (
                last.op, last.src_dtype, last.dst_dtype, last.src_space, last.add, last.unpermute):
            out[i], last_i = k, i
        elif (k.op == "convert" and k.src_offset == last.src_offset + DTYPES[k.src_dtype].nbytes(last.numel)
                and k.dst_offset == last.dst_offset + DTYPES[k.dst_dtype].nbytes(last.numel)):
            out[last_i] = last._replace(numel=last.numel + k.numel, rows=0, cols=0, more=(*last.more, k.part))
        elif (k.op == "gguf" and ggml.get(k.part) == ggml.get(last.part) and k.cols == last.cols
                and k.src_offset == last.src_offset + last.rows * last.cols
                and k.dst_offset == last.dst_offset + DTYPES[k.dst_dtype].nbytes(last.numel)):
            out[last_i] = last._replace(numel=last.numel + k.numel, rows=last.rows + k.rows, more=(*last.more, k.part))
        else:
            out[i], last_i = k, i
    return tuple(out[i] for i in sorted(out))


def _kernel(n: Part, space: str, src: int, scale: int | None, dst: int) -> Kernel:
    w = n.inputs[0]
    fmt = kernel_format(n.op, w.dtype, n.inputs[1].dtype if len(n.inputs) >= 2 else None)
    if fmt in fp4.FORMATS:
        # An FP4 dequantization: rows and cols of the dequantized matrices (before a transpose),
        # numel the values of all of them.
        batch, rows, cols = fp4.geometry(fmt, w.shape)
        return _tuple_new(Kernel, (n.id, n.op, w.dtype, n.out_dtype, space, src, scale, dst, batch * rows * cols,
                                   rows, cols, n.block, (), fmt, 0.0, 0))
    if fmt == "gguf":  # U8 rows of GGUF blocks: numel counts the values the kernel writes
        rows, cols = w.shape
        return _tuple_new(Kernel, (n.id, n.op, w.dtype, n.out_dtype, space, src, scale, dst,
                                   n.out_bytes // _ITEMSIZE[n.out_dtype], rows, cols, n.block, (), fmt, 0.0,
                                   n.unpermute))
    shape = w.shape
    rows, cols = shape if len(shape) == 2 else (0, 0)
    numel = 1
    for d in shape:
        numel *= d
    return _tuple_new(Kernel, (n.id, n.op, w.dtype, n.out_dtype, space, src, scale, dst, numel, rows, cols, n.block,
                               (), fmt, n.add, 0))


def _requests(segs, io: IO) -> tuple[tuple[Request, ...], int]:
    """Coalesce segments into extents, cut extents into slot-sized requests, map copies.

    Returns the requests and how many requests the segments would take each read alone.

    A segment joins the extent before it only when the gap is at most `io.merge_gap` and joining
    costs no more requests and no more copies than reading it alone would: the extent's slot grid
    is the file's, so a gap can carry the extent across one more slot boundary.
    """
    segs = sorted([s for s in segs if s[2] > 0], key=_FILE_START)
    extents = []  # [file, start, end, [segs], requests, copies, start aligned down]
    slot, merge_gap, total_alone, ext = io.slot, io.merge_gap, 0, None
    A = DIRECT_ALIGN
    for s in segs:
        f, start, nbytes, space, dst = s
        top = start + nbytes
        first = start // A * A // slot  # the slot-grid cells of its aligned bytes
        alone = (-(-top // A) * A - 1) // slot - first + 1
        total_alone += alone  # requests (and copies) of the segment read on its own
        if ext and ext[0] == f and start - ext[2] <= merge_gap:
            # requests and copies of the extent once the segment joins it
            a = ext[6]
            reqs = (-(-(top if top > ext[2] else ext[2]) // A) * A - 1) // slot - a // slot + 1
            _, p_start, p_nbytes, p_space, p_dst = ext[3][-1]
            copies = ext[5] + (top - 1) // slot - start // slot + 1
            if (p_start + p_nbytes == start and p_space == space and p_dst + p_nbytes == dst
                    and start % slot != 0):
                copies -= 1
            if reqs <= ext[4] + alone and copies <= ext[5] + alone:
                if start + nbytes > ext[2]:
                    ext[2] = start + nbytes
                ext[3].append(s)
                ext[4], ext[5] = reqs, copies
                continue
        ext = [f, start, start + nbytes, [s], alone, alone, start // DIRECT_ALIGN * DIRECT_ALIGN]
        extents.append(ext)
    out = []
    for f, _, end, members, _, _, a in extents:
        e = _align(end, DIRECT_ALIGN)
        copies = _copies(a, e, slot, members)
        out.extend(Request(f, q, top - q, cs) for (q, top), cs in zip(_grid(a, e, slot), copies))
    return tuple(out), total_alone


def _grid(a: int, e: int, slot: int) -> list[tuple[int, int]]:
    """[a, e) cut at the file offsets that are multiples of `slot`: (start, end) of each piece."""
    cuts = [a, *range((a // slot + 1) * slot, e, slot), e]
    return list(zip(cuts, cuts[1:]))


def _copies(a: int, e: int, slot: int, members) -> list[tuple[Copy, ...]]:
    """The copies of each request of extent [a, e) (`_grid`), in one pass over its members.

    Members are cut at slot-grid boundaries; within a request, a piece contiguous with the copy
    before it on both sides extends that copy.
    """
    first = a // slot
    per: list[list[list]] = [[] for _ in range((e - 1) // slot - first + 1)]
    for _, start, nbytes, space, dst in members:
        pos, end = start, start + nbytes
        while pos < end:
            cell = pos // slot
            k, top = cell - first, (cell + 1) * slot
            base = a if k == 0 else cell * slot
            hi = end if end < top else top
            slot_off, d, n = pos - base, dst + (pos - start), hi - pos
            copies = per[k]
            last = copies[-1] if copies else None
            if last and last[1] == space and last[0] + last[3] == slot_off and last[2] + last[3] == d:
                last[3] += n
            else:
                copies.append([slot_off, space, d, n, 1, 0])
            pos = hi
    return [tuple([_tuple_new(Copy, c) for c in copies]) for copies in per]
