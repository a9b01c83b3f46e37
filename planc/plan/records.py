"""The plan IR: every record of a load plan as an immutable typed value.

`graph` and `schedule` produce these records; `admission` replays them; `explain`, `execute/` and
`verify` read them by attribute. `plan.py` is their one codec (encode, decode, validate).

Records that a plan holds by the hundred thousand (inputs, parts, requests, copies, kernels, steps)
are `NamedTuple`s: immutable, built fast, small. The counts a plan reports (requests, copies,
kernels, scatters) are properties of these records and are defined here only:

- a run's requests: one per ring request, plus one per segment that a host-path part reads;
- a run's copies: one per copy of a request (one for a scattered request: it is copied whole to a
  device staging slot), plus the ring-sized copies that stage each host-path part's output;
- a run's kernels: one per conversion, dequantization or transpose, plus one scatter per
  scattered request;
- the plan's totals: the sums over its runs, plus one copy for the scatter table (uploaded once)
  and one kernel per zero-filled padding region.

The step DAG (`Plan.steps`, `Plan.dag()`) is derived from the parts, so it cannot disagree with
them: `alloc` steps for the ring and the device regions, then per part `read` (one per input),
`normalize`, `pack` and `stage`, each listing the steps it waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import NamedTuple

from ..base.codes import Code

SPACES = ("arena", "landing")
OPS = ("copy", "convert", "dequantize", "transpose", "dequantize_t", "gguf")
KERNEL_OPS = ("convert", "dequantize", "transpose", "dequantize_t", "gguf")
DEQUANTIZE_OPS = ("dequantize", "dequantize_t")  # dequantize_t: an FP4 weight, its last two dims swapped
# gguf: a GGUF tensor's quantized blocks (read as U8 rows of whole blocks, its GGML type in the part's
# `ggml`) dequantized to F32, F16 or BF16 (`planc.execute.kernels.gguf_dequant`, `planc.execute.kernels.gguf_kernels`).
PATHS = ("direct", "host")
DIRECT_MODES = ("auto", "on", "off")


class FileEntry(NamedTuple):
    """A checkpoint file and its fingerprint (size and mtime when the plan was compiled)."""

    path: str  # relative to the checkpoint root
    size_bytes: int
    mtime_ns: int


class Checkpoint(NamedTuple):
    source: str  # what the spec named
    root: str  # the folder every file path is relative to
    files: tuple[FileEntry, ...]


class SpecRef(NamedTuple):
    path: str
    sha256: str


class TensorParallel(NamedTuple):
    rank: int
    size: int


class Budget(NamedTuple):
    host_bytes: int
    device_bytes: int | None


class IOSettings(NamedTuple):
    workers: int
    slot_bytes: int
    slots: int
    run_bytes: int
    direct: str
    merge_gap_bytes: int
    strided: str = "auto"  # auto | mapped | rows
    # Mapped strided reads: file bytes one maps at a time, and windows mapped at once (what bounds
    # the mapped pages the RSS counts: `layout.map_bytes`). A plan without them was written when
    # every reader mapped 8 MiB windows on 4 lanes, and is read so.
    map_window_bytes: int = 8 << 20
    map_lanes: int = 4


class Costs(NamedTuple):
    """The I/O cost figures the compiler chose read methods by (a probe's, or the defaults).

    A strided slice read through a mapping costs `page_s` per page it touches plus `copy_byte_s` per
    byte; read as whole rows it costs `read_byte_s` per byte of the rows plus `request_s` per request.
    Both reach the device at the same link speed (2-D copies carry only the slice), so the link
    does not enter the choice.
    """

    source: str  # "default" or the probe file the figures came from
    page_s: float
    copy_byte_s: float
    read_byte_s: float
    request_s: float
    # A byte read from disk, cold, O_DIRECT, all readers together: the predicted cold wall's figure
    # (not the choice's). A probe file without it, or a plan saved before it, has the built-in one.
    disk_byte_s: float = 5.56e-10  # 1.8 GB/s
    # A byte copied from pinned host memory to the device (`planc probe`'s 64 MiB copies, where it had a
    # GPU): the predicted wall's link and the reports' limit. Without it, the built-in H200 host's 55.4 GB/s.
    link_byte_s: float = 1 / 55.4e9


SCATTER_ROW_BYTES = 24  # a scatter-table row: (slot offset, arena offset, length), int64 each


class Layout(NamedTuple):
    """Device regions and the host ring, each allocated once before the first read."""

    arena_bytes: int
    landing_region_bytes: tuple[int, int]  # (even runs, odd runs)
    staging_bytes: int  # device staging slots of scattered requests
    scatter_segments: int  # rows of the scatter table
    zero: tuple[tuple[int, int], ...]  # (arena offset, bytes) zero-filled before the load
    ring_bytes: int  # pinned host ring
    map_bytes: int = 0  # file windows mapped at once by strided reads (page cache, counted in RSS)

    @property
    def held_host_bytes(self) -> int:
        """Host bytes held from the first read to the end: the ring and the mapped windows."""
        return self.ring_bytes + self.map_bytes

    @property
    def landing_bytes(self) -> int:
        return self.landing_region_bytes[0] + self.landing_region_bytes[1]

    @property
    def scatter_table_bytes(self) -> int:
        """The scatter table on the device: three int64 a row, uploaded once with the regions."""
        return SCATTER_ROW_BYTES * self.scatter_segments

    @property
    def device_bytes(self) -> int:
        return self.arena_bytes + self.landing_bytes + self.staging_bytes + self.scatter_table_bytes


class Tensor(NamedTuple):
    """A tensor as it will exist on the device: a typed view at `offset_bytes` in the arena."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset_bytes: int
    nbytes: int


class Input(NamedTuple):
    """The bytes read from a checkpoint file for a part: `count` segments of `seg` bytes, `stride` apart.

    A whole tensor, or a tensor-parallel slice of its leading dim, is one segment; a slice of a later
    dim is one record too (base, stride, length, count), never one record per row. `shape` is the
    shape of what is read (the slice).
    """

    role: str  # weight | scale | scale2 (NVFP4's per-tensor scale)
    tensor: str  # source tensor name
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


class Part(NamedTuple):
    """One source tensor (or its rank's slice) placed into one output tensor."""

    id: int
    tensor: str  # output tensor name
    index: int  # part index within the tensor
    op: str  # copy | convert | dequantize | transpose | dequantize_t | gguf
    path: str  # direct | host
    reason: str
    inputs: tuple[Input, ...]
    offset_bytes: int  # within the output tensor
    out_bytes: int
    out_dtype: str
    landing_bytes: int  # device landing bytes (direct path, kernel not in place)
    host_bytes: int  # owned read buffers + scratch (host path)
    block: int
    zero_bytes: int = 0  # zero padding after out_bytes (uneven tensor-parallel split)
    # The GGML type of a GGUF tensor's quantized blocks ("Q4_K", ...), read as U8 rows of whole blocks:
    # dequantized by a `gguf` part, kept as stored by a `copy` part; "" for every other part.
    ggml: str = ""
    # A constant added to every value of a `convert` part in float32 (the sum rounded to float32, then
    # to out_dtype; llama.cpp stores Gemma's RMSNorm weights plus one: `add: -1` takes it off); 0.0 else.
    add: float = 0.0
    # A `gguf` part of a GGUF Llama q / k weight read whole: its kernel writes its rows in transformers'
    # order (`planc.manifest.gguf_names.unpermute_rows`, heads of `unpermute` rows each); 0 else.
    unpermute: int = 0
    dst_offset: int = -1  # in the arena (set by the schedule)

    @property
    def read_bytes(self) -> int:
        inputs = self.inputs
        return inputs[0].nbytes if len(inputs) == 1 else inputs[0].nbytes + inputs[1].nbytes  # a part has 1 or 2

    @property
    def label(self) -> str:
        return f"{self.tensor}#{self.index}"

    @property
    def reads(self) -> int:
        """Read requests of a host-path part: one per segment of each input."""
        return sum(i.count for i in self.inputs)


class Copy(NamedTuple):
    """Slot bytes to the device: `rows` rows of `nbytes`, `pitch` apart in the slot, packed at the
    destination (a 2-D copy when rows > 1: a rank's slice of whole rows held in the slot)."""

    slot_offset: int
    space: str  # arena | landing
    dst_offset: int
    nbytes: int
    rows: int = 1
    pitch: int = 0  # slot bytes from one row's start to the next (rows > 1)

    @property
    def moved(self) -> int:
        return self.nbytes * self.rows

    @property
    def slot_end(self) -> int:
        return self.slot_offset + (self.rows - 1) * self.pitch + self.nbytes


class Request(NamedTuple):
    """One read into one ring slot, and where its bytes go.

    stride == 0: one `preadv` of `length` bytes at `offset` (4 KiB aligned, so that O_DIRECT may
    serve it). stride > 0, a strided read: `count` segments of `length` bytes, `stride` apart from
    `offset`, packed one after the other in the slot (a rank's slice of a later dim, read without
    the bytes of the other ranks); served from the page cache through a mapping.
    """

    file: str
    offset: int  # 4 KiB aligned unless strided
    length: int  # <= slot; may reach past end of file (a short read there is expected)
    copies: tuple[Copy, ...]
    scatter: bool = False  # copied whole to device staging slot `staging`, then scattered by a kernel
    staging: int = -1
    width: int = 1  # scatter element width: every offset and length is a multiple of it
    stride: int = 0  # > 0: a strided read; file bytes from one segment's start to the next
    count: int = 1  # strided read: segments

    @property
    def read_bytes(self) -> int:
        return self.length * self.count

    @property
    def strided(self) -> bool:
        return self.stride > 0

    @property
    def h2d_copies(self) -> int:
        return 1 if self.scatter else len(self.copies)

    @property
    def needed(self) -> int:
        """Bytes of the slot that the copies read: what the read must deliver."""
        if self.stride:
            return self.length * self.count
        return max((c.slot_end for c in self.copies), default=0)


class Kernel(NamedTuple):
    """One launch: a part's values (and those of `more`, end to end) from their source bytes to the
    arena. `format` names the kernel family (`planc.base.formats`: float, transpose, fp8, mxfp4,
    nvfp4, gguf): the executor launches it through that format's class (`planc.execute.kernels.formats`)."""

    part: int
    op: str  # convert | dequantize | transpose | dequantize_t | gguf
    src_dtype: str
    dst_dtype: str
    src_space: str
    src_offset: int
    scale_offset: int | None  # landing offset of the scale (dequantize)
    dst_offset: int  # arena
    numel: int
    rows: int
    cols: int
    block: int
    more: tuple[int, ...] = ()  # further parts converted by the same launch, their bytes following part's
    format: str = ""  # the kernel's format (`planc.base.formats.FORMATS`), which its part's op and dtypes decide
    add: float = 0.0  # its parts' `add` (a launch converts parts of one add only)
    unpermute: int = 0  # its parts' `unpermute` (rows per head written in transformers' order; 0: as read)

    @property
    def parts(self) -> tuple[int, ...]:
        """The parts one launch converts, in the order their bytes lie (on both sides)."""
        return (self.part, *self.more)


class HostPart(NamedTuple):
    part: int
    dst_offset: int  # arena
    copies: int  # staging copies through the ring


class Run(NamedTuple):
    index: int
    parts: tuple[int, ...]
    requests: tuple[Request, ...]
    kernels: tuple[Kernel, ...]
    host_parts: tuple[HostPart, ...]
    landing_region: int
    landing_bytes: int
    host_bytes: int  # host bytes beyond the ring while the run goes (its replay peak)
    read_bytes: int  # bytes requested (requests, plus host-path inputs)
    payload_bytes: int  # bytes of tensor data the run needs
    requests_uncoalesced: int
    copies_uncoalesced: int

    @property
    def scatters(self) -> int:
        return sum(1 for r in self.requests if r.scatter)

    @property
    def copy_count(self) -> int:
        return sum(r.h2d_copies for r in self.requests) + sum(h.copies for h in self.host_parts)

    @property
    def kernel_count(self) -> int:
        return len(self.kernels) + self.scatters

    def request_count(self, parts) -> int:
        return len(self.requests) + sum(parts[h.part].reads for h in self.host_parts)


class Step(NamedTuple):
    """A node of the step DAG: what it does, the host and device bytes it holds, what it waits for."""

    id: str
    kind: str  # alloc | read | normalize | pack | stage
    part: int  # -1 for alloc steps
    host_bytes: int
    device_bytes: int
    note: str
    deps: tuple[str, ...]


class Window(NamedTuple):
    """The replay's state while run k goes."""

    run: int
    host_bytes: int  # ring + the run's host-path buffers at their peak
    device_bytes: int
    ring_bytes: int
    host_inflight_bytes: int
    landing_bytes: int
    resident_bytes: int  # arena bytes filled once run k is done


class Refusal(NamedTuple):
    """Why a plan, a run or a node does not fit: the one refusal record of planc. Admission makes it
    (`host-budget`, `device-budget`), the executor's live checks too (`live-room`, `device-room`),
    explain for a node (`node-budget`); `AdmissionError.refusal` carries it and `as_dict()` is its JSON
    (the plan's and `explain --json`'s `refusal`)."""

    code: Code
    run: int | None  # the run's index; None for a node's refusal (all the ranks that share a host)
    step: str  # a step id of the plan (`alloc:ring`, `read:T#0:weight`...), or "node"
    needed_bytes: int
    allowed_bytes: int
    message: str

    def as_dict(self) -> dict:
        d = self._asdict()
        d["code"] = str(self.code)
        return d


class Peak(NamedTuple):
    host_bytes: int
    device_bytes: int


class Totals(NamedTuple):
    tensors: int
    source_tensors: int
    payload_bytes: int
    read_bytes: int
    requests: int
    requests_uncoalesced: int
    copies: int
    copies_uncoalesced: int
    kernels: int
    scatters: int
    resident_bytes: int
    runs: int


class Timeline(NamedTuple):
    windows: tuple[Window, ...]
    host_peak_bytes: int
    device_peak_bytes: int
    refusal: Refusal | None

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @property
    def peak(self) -> Peak:
        return Peak(self.host_peak_bytes, self.device_peak_bytes)


@dataclass(frozen=True, eq=False)
class Plan:
    """A load plan: what `execute` does and what `explain` shows, with the admission decision."""

    planc: str
    spec: SpecRef
    checkpoint: Checkpoint
    device: str
    tensor_parallel: TensorParallel
    budget: Budget
    io: IOSettings
    layout: Layout
    tensors: tuple[Tensor, ...]  # sorted by name
    parts: tuple[Part, ...]  # in schedule order; part id = position
    runs: tuple[Run, ...]
    skipped: tuple[str, ...]
    peak: Peak
    refusal: Refusal | None
    timeline: tuple[Window, ...] = field(default=())
    costs: Costs | None = None  # the figures the read methods were chosen by
    # Where this value came from, for `explain` (not in the plan file): ("device_budget", how
    # `budget.device` was found), ("source", "compiled" | "cache: PATH" | "file: PATH").
    notes: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @cached_property
    def totals(self) -> Totals:
        runs, parts, lay = self.runs, self.parts, self.layout
        return Totals(
            tensors=len(self.tensors),
            source_tensors=len(parts),
            payload_bytes=sum(r.payload_bytes for r in runs),
            read_bytes=sum(r.read_bytes for r in runs),
            requests=sum(r.request_count(parts) for r in runs),
            requests_uncoalesced=sum(r.requests_uncoalesced for r in runs),
            copies=sum(r.copy_count for r in runs) + (1 if lay.scatter_segments else 0),
            copies_uncoalesced=sum(r.copies_uncoalesced for r in runs),
            kernels=sum(r.kernel_count for r in runs) + sum(1 for _, n in lay.zero if n > 0),
            scatters=sum(r.scatters for r in runs),
            resident_bytes=sum(t.nbytes for t in self.tensors),
            runs=len(runs),
        )

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The step DAG in the executor's order (a topological order): alloc steps, then each part's."""
        out = list(alloc_steps(self.layout))
        for n in self.parts:
            out += part_steps(n)
        return tuple(out)

    def dag(self):
        """The steps as a networkx DiGraph (attributes: kind, part, host_bytes, device_bytes)."""
        import networkx as nx

        g = nx.DiGraph()
        for s in self.steps:
            g.add_node(s.id, kind=s.kind, part=s.part, host_bytes=s.host_bytes, device_bytes=s.device_bytes)
            g.add_edges_from((d, s.id) for d in s.deps)
        return g

    def note(self, key: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.notes if k == key), default)

    def with_notes(self, **notes: str) -> "Plan":
        return replace(self, notes=tuple((k, v) for k, v in self.notes if k not in notes) + tuple(notes.items()))

    def with_decision(self, tl: Timeline) -> "Plan":
        return replace(self, peak=tl.peak, refusal=tl.refusal, timeline=tl.windows)

    def with_budget(self, host_bytes: int | None = None, device_bytes=...) -> "Plan":
        """The same plan under other budgets (undecided until replayed)."""
        b = self.budget
        return replace(self, budget=Budget(b.host_bytes if host_bytes is None else host_bytes,
                                           b.device_bytes if device_bytes is ... else device_bytes))

    def to_dict(self) -> dict:
        """The plan as nested dicts and lists with field names (`plan_dict`)."""
        return plan_dict(self)

    def __repr__(self) -> str:
        return f"Plan({self.spec.path!r}, {len(self.parts)} parts, fits={self.fits})"


# -- the step DAG ---------------------------------------------------------------------------------

ALLOC_RING, ALLOC_DEVICE = "alloc:ring", "alloc:device"


def alloc_steps(lay: Layout) -> tuple[Step, ...]:
    """The allocations made once, before the first read: the pinned ring and the device regions."""
    note = "pinned host ring" + (" + mapped read windows" if lay.map_bytes else "")
    return (Step(ALLOC_RING, "alloc", -1, lay.held_host_bytes, 0, note, ()),
            Step(ALLOC_DEVICE, "alloc", -1, 0, lay.device_bytes, "arena + landing + staging + scatter table", ()))


def part_steps(n: Part) -> list[Step]:
    """A part's steps, each after the steps it waits for (emission order is a topological order).

    Direct path: read -> stage -> normalize/pack on the device. Host path: read -> normalize ->
    pack on the host -> stage. A host-path part's buffers (reads, scratch) are all held until its
    stage step, which releases them: the executor frees them once the output is in the ring.
    """
    p = n.label
    pid, op = n.id, n.op
    host = n.path == "host"
    reads = [Step(f"read:{p}:{i.role}", "read", pid, i.nbytes if host else 0, 0, _read_note(i),
                  (ALLOC_RING,)) for i in n.inputs]
    out = list(reads)
    prev = tuple(sorted(s.id for s in reads))
    transform = op in ("convert", "dequantize", "dequantize_t", "gguf")
    if host:
        if transform:
            # the output and the chunk scratch (`planc.plan.hostcost`): the part's bytes beyond its reads
            held = n.host_bytes - sum(i.nbytes for i in n.inputs)
            out.append(Step(f"normalize:{p}", "normalize", pid, held, 0, f"{op} on host", prev))
            prev = (out[-1].id,)
        if op == "transpose":
            extra = n.host_bytes - n.read_bytes - (n.out_bytes if transform else 0)
            out.append(Step(f"pack:{p}", "pack", pid, extra, 0, "transpose on host", prev))
            prev = (out[-1].id,)
        out.append(Step(f"stage:{p}", "stage", pid, 0, n.out_bytes, "pinned ring -> device",
                        tuple(sorted(prev + (ALLOC_DEVICE,)))))
        return out
    out.append(Step(f"stage:{p}", "stage", pid, 0, n.out_bytes, "pinned ring -> device",
                    tuple(sorted(prev + (ALLOC_DEVICE,)))))
    prev = (out[-1].id,)
    if transform:
        out.append(Step(f"normalize:{p}", "normalize", pid, 0, n.landing_bytes,
                        _device_note(op, n.landing_bytes == 0), prev))
        prev = (out[-1].id,)
    if op == "transpose" or n.index > 0 or n.offset_bytes > 0:
        landing = n.landing_bytes if op == "transpose" else 0
        note = "transpose on device" if op == "transpose" else "placed by offset (no scratch)"
        out.append(Step(f"pack:{p}", "pack", pid, 0, landing, note, prev))
    return out


def _read_note(i: Input) -> str:
    if i.count > 1:
        return f"{i.file}@{i.start}+{i.seg}x{i.count}/{i.stride}"
    return f"{i.file}@{i.start}+{i.nbytes}"


@lru_cache(maxsize=None)
def _device_note(op: str, in_place: bool) -> str:
    return f"{op} on device ({'in place' if in_place else 'landing buffer'})"


# -- a readable form ------------------------------------------------------------------------------

def plan_dict(plan: Plan) -> dict:
    """The plan as nested dicts and lists, field names spelled out (for people, tests and tools;
    the plan file itself is the compact form that `plan.encode` writes)."""
    parts = plan.parts

    def rec(x):
        if isinstance(x, Copy):
            return list(x)
        if hasattr(x, "_asdict"):
            return {k: rec(v) for k, v in x._asdict().items()}
        if isinstance(x, tuple):
            return [rec(v) for v in x]
        return x

    runs = []
    for r in plan.runs:
        d = rec(r)
        d["tensors"] = len({parts[p].tensor for p in r.parts})
        runs.append(d)
    return {
        "kind": "planc-plan", "planc": plan.planc,
        "spec": rec(plan.spec), "checkpoint": rec(plan.checkpoint), "device": plan.device,
        "tensor_parallel": rec(plan.tensor_parallel), "budget": rec(plan.budget), "io": rec(plan.io),
        "layout": rec(plan.layout), "tensors": rec(plan.tensors), "parts": rec(plan.parts),
        "steps": rec(plan.steps), "runs": runs, "timeline": rec(plan.timeline), "skipped": list(plan.skipped),
        "totals": rec(plan.totals), "peak": rec(plan.peak), "fits": plan.fits, "refusal": rec(plan.refusal),
        "costs": rec(plan.costs),
    }
