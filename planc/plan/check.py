"""Checking a decoded plan document: every field the executor will trust, before it is allocated.

Input: the JSON document of a plan file (format 8, see `planc/plan/codec.py` and docs/plan.md); output: an
`records.Plan`, or a `PlanFormatError` naming the field path. Checked: types and ranges of every field;
ids and order; every read inside its file's fingerprinted size; every copy inside its slot and its
region; every kernel's ranges; every tensor inside the arena, tensors disjoint; each part's sizes
following from its op and dtypes; coverage (every byte lands where its part says, once); and the
recorded peaks and decision equal to a fresh replay (`admission.admit`).

Array records take a fast path that checks all their fields at once and falls back to the
field-by-field check, which names what is wrong, only when something is; both are made from one
statement of each record's field kinds and bounds (`planc.plan.fieldcheck`). What is here relates a
record to the others and to the plan.
"""

from __future__ import annotations

import math

from .admission import admit, run_host_bytes
from ..base.dtypes import DTYPES, op_problem
from ..base.formats import kernel_format
from ..base.errors import PlanFormatError, printable
from . import costs as costmodel
from .costs import STRIDED_MODES, map_bytes, map_bytes_bound, window_bytes
from ..base.units import MAX_BYTES
from ..base.limits import (
    MAX_MAP_LANES,
    MAX_MAP_WINDOW,
    MAX_SLOT,
    MAX_SLOTS,
    MAX_TP,
    MAX_WORKERS,
    MIN_MAP_WINDOW,
)
from ..base import fp4
from .hostcost import scratch_bytes
from .checkbase import _Bad, _bad, _int, _list, _one_of, _shown, _str
from .formatcheck import CHECKS
from .fieldcheck import Fields, shape_ok
from .records import (
    DEQUANTIZE_OPS,
    DIRECT_MODES,
    Budget,
    Checkpoint,
    Copy,
    Costs,
    FileEntry,
    HostPart,
    Input,
    IOSettings,
    Kernel,
    Layout,
    Part,
    Peak,
    Plan,
    Refusal,
    Request,
    Run,
    SpecRef,
    Tensor,
    TensorParallel,
)
from ..base.device import DIRECT_ALIGN, check_device
from ..base.codes import Code

FORMAT = 8

# The field order of each array record, as the file states it.
# Names repeated by the thousand are written once, in a table, and referred to by index: the
# output tensor of a part (`tensors`), its reason (`reasons`), the source tensor of an input
# (`sources`) and the file of an input or request (`checkpoint.files`).
_INDEXED = {"tensor": "tensor_index", "reason": "reason_index", "file": "file_index"}
FIELDS = {
    "file": ["path", "size_bytes", "mtime_ns"],
    "tensor": list(Tensor._fields),
    "part": [_INDEXED.get(f, f) for f in Part._fields if f != "id"],
    "input": [{"tensor": "source_index", "file": "file_index"}.get(f, f) for f in Input._fields],
    "run": [f for f in Run._fields if f != "index"],
    "request": [_INDEXED.get(f, f) for f in Request._fields],
    "copy": list(Copy._fields),
    "kernel": list(Kernel._fields),
    "host_part": list(HostPart._fields),
}
_TOP = ("kind", "format", "planc", "fields", "spec", "checkpoint", "device", "tensor_parallel", "budget", "io",
        "layout", "tensors", "reasons", "sources", "parts", "runs", "skipped", "peak", "refusal", "costs")
# each array record's field checks, from one statement of their kinds (`planc.plan.fieldcheck`)
_TENSOR, _PART, _INPUT, _REQUEST, _COPY, _KERNEL, _HOST_PART = (
    Fields(k, FIELDS[k]) for k in ("tensor", "part", "input", "request", "copy", "kernel", "host_part"))


# -- encode ---------------------------------------------------------------------------------------


def _obj(v, path: str, keys) -> dict:
    if type(v) is not dict:
        raise _bad(path, f"must be an object, got {_shown(v)}")
    keys = tuple(keys)
    if set(v) != set(keys):
        missing = sorted(set(keys) - set(v))
        extra = sorted(set(v) - set(keys))
        what = f"missing {', '.join(missing)}" if missing else f"unknown key {', '.join(map(printable, extra))}"
        raise _bad(path, what)
    return v


def _strings(v, path: str) -> tuple[str, ...]:
    if type(v) is list and (not v or set(map(type, v)) == _STRS):
        return tuple(v)
    return tuple(_str(x, f"{path}[{k}]") for k, x in enumerate(_list(v, path)))


_STRS = {str}
_LATER_COSTS = ("disk_byte_s", "link_byte_s")  # cost figures a plan saved before them leaves out
_PLAN_REFUSALS = (Code.HOST_BUDGET.value, Code.DEVICE_BUDGET.value)




def _nat(*vals) -> bool:
    """Whether every value is an int in [0, _MAX]: the fast check before the field-by-field one."""
    for v in vals:
        if type(v) is not int or v < 0 or v > _MAX:
            return False
    return True


_NBYTES: dict = {}


def _nbytes_of(dtype: str, shape: tuple, path: str) -> int:
    n = _NBYTES.get((dtype, shape))
    if n is not None:
        return n
    n = DTYPES[dtype].nbytes(math.prod(shape))
    if n is not None:
        _NBYTES[(dtype, shape)] = n
    if n is None:
        raise _bad(path, f"{dtype} x {list(shape)} is not a whole number of bytes")
    return n


_MAX = MAX_BYTES  # any byte count or offset beyond this is not a real one (units.MAX_BYTES: 2**62)
new = tuple.__new__  # a record built from checked fields, without its Python-level constructor


def check(doc, where: str) -> Plan:
    """The plan a decoded document describes, every field checked; raises `PlanFormatError`."""
    return _Checker(where).plan(doc)


class _Checker:
    def __init__(self, where: str):
        self.where = where

    def plan(self, doc: dict) -> Plan:
        try:
            return self._plan(doc)
        except _Bad as e:
            raise PlanFormatError(f"{self.where}: invalid plan: {e.path}: {e.problem}", code=Code.PLAN_INVALID) from None

    def _plan(self, doc: dict) -> Plan:
        _obj(doc, "plan", _TOP)
        if doc["fields"] != FIELDS:
            raise _bad("fields", f"record layout differs from format {FORMAT}'s; compile the spec again")
        planc = _str(doc["planc"], "planc")
        spec = _obj(doc["spec"], "spec", SpecRef._fields)
        spec = SpecRef(_str(spec["path"], "spec.path"), _str(spec["sha256"], "spec.sha256"))
        self.files = files = self._checkpoint(doc["checkpoint"])
        device = _str(doc["device"], "device")
        try:  # the executor selects it by its index
            check_device(device)
        except ValueError as e:
            raise _bad("device", str(e)) from None
        tp = _obj(doc["tensor_parallel"], "tensor_parallel", TensorParallel._fields)
        size = _int(tp["size"], "tensor_parallel.size", 1, MAX_TP)
        tp = TensorParallel(_int(tp["rank"], "tensor_parallel.rank", 0, size - 1), size)
        b = _obj(doc["budget"], "budget", Budget._fields)
        budget = Budget(_int(b["host_bytes"], "budget.host_bytes", 0, _MAX),
                        None if b["device_bytes"] is None else _int(b["device_bytes"], "budget.device_bytes", 0, _MAX))
        self.io = io = self._io(doc["io"])
        self.layout = lay = self._layout(doc["layout"], io)
        tensors = self._tensors(doc["tensors"], lay)
        self.reasons = _strings(doc["reasons"], "reasons")
        self.sources = _strings(doc["sources"], "sources")
        parts = self._parts(doc["parts"], tensors, files)
        runs = self._runs(doc["runs"], parts, files, io, lay)
        skipped = tuple(_str(s, f"skipped[{k}]") for k, s in enumerate(_list(doc["skipped"], "skipped")))
        pk = _obj(doc["peak"], "peak", Peak._fields)
        peak = Peak(_int(pk["host_bytes"], "peak.host_bytes", 0, _MAX), _int(pk["device_bytes"], "peak.device_bytes", 0, _MAX))
        refusal = None if doc["refusal"] is None else self._refusal(doc["refusal"])
        costs = self._costs(doc["costs"])
        files_t = Checkpoint(self.source, self.root, files)
        plan = Plan(planc, spec, files_t, device, tp, budget, io, lay, tensors, parts, runs, skipped, peak, refusal,
                    costs=costs)
        _coverage(plan)
        return self._decision(plan)

    # -- small records --------------------------------------------------------------------------
    def _checkpoint(self, v) -> tuple[FileEntry, ...]:
        _obj(v, "checkpoint", ("source", "root", "files"))
        self.source = _str(v["source"], "checkpoint.source")
        self.root = _str(v["root"], "checkpoint.root")
        out, seen = [], set()
        for k, f in enumerate(_list(v["files"], "checkpoint.files")):
            at = f"checkpoint.files[{k}]"
            _list(f, at, 3)
            path = _str(f[0], f"{at}.path")
            parts = path.replace("\\", "/").split("/")
            if not path or path.startswith("/") or ".." in parts or "\x00" in path or path in seen:
                raise _bad(f"{at}.path", f"{_shown(path)} is not a file inside the checkpoint folder (or is listed twice)")
            seen.add(path)
            out.append(FileEntry(path, _int(f[1], f"{at}.size_bytes", 0, _MAX), _int(f[2], f"{at}.mtime_ns", -_MAX, _MAX)))
        return tuple(out)

    def _io(self, v) -> IOSettings:
        mapping = {k: IOSettings._field_defaults[k] for k in ("map_window_bytes", "map_lanes")}
        if type(v) is dict and not any(k in v for k in mapping):  # written before the plan carried them:
            v = {**v, **mapping}  # read with the window and lanes they were run with
        _obj(v, "io", IOSettings._fields)
        slot = _int(v["slot_bytes"], "io.slot_bytes", DIRECT_ALIGN, MAX_SLOT)
        if slot % DIRECT_ALIGN:
            raise _bad("io.slot_bytes", f"must be a multiple of {DIRECT_ALIGN}, got {slot:,}")
        return IOSettings(_int(v["workers"], "io.workers", 1, MAX_WORKERS), slot, _int(v["slots"], "io.slots", 1, MAX_SLOTS),
                          _int(v["run_bytes"], "io.run_bytes", 1, _MAX), _one_of(v["direct"], "io.direct", DIRECT_MODES),
                          _int(v["merge_gap_bytes"], "io.merge_gap_bytes", 0, _MAX),
                          _one_of(v["strided"], "io.strided", STRIDED_MODES),
                          _int(v["map_window_bytes"], "io.map_window_bytes", MIN_MAP_WINDOW, MAX_MAP_WINDOW),
                          _int(v["map_lanes"], "io.map_lanes", 1, MAX_MAP_LANES))

    def _layout(self, v, io: IOSettings) -> Layout:
        _obj(v, "layout", Layout._fields)
        arena = _int(v["arena_bytes"], "layout.arena_bytes", 0, _MAX)
        regions = _list(v["landing_region_bytes"], "layout.landing_region_bytes", 2)
        regions = (_int(regions[0], "layout.landing_region_bytes[0]", 0, _MAX),
                   _int(regions[1], "layout.landing_region_bytes[1]", 0, _MAX))
        slot = io.slot_bytes
        staging = _int(v["staging_bytes"], "layout.staging_bytes", 0, io.slots * slot)
        if staging % slot:
            raise _bad("layout.staging_bytes", f"must be a whole number of slots ({slot:,} bytes), got {staging:,}")
        ring = _int(v["ring_bytes"], "layout.ring_bytes", 0, io.slots * slot)
        if ring % slot:
            raise _bad("layout.ring_bytes", f"must be a whole number of slots ({slot:,} bytes), got {ring:,}")
        segs = _int(v["scatter_segments"], "layout.scatter_segments", 0, _MAX)
        zero = []
        for k, z in enumerate(_list(v["zero"], "layout.zero")):
            at = f"layout.zero[{k}]"
            _list(z, at, 2)
            off, n = _int(z[0], f"{at}[0]", 0, arena), _int(z[1], f"{at}[1]", 0, arena)
            if off + n > arena:
                raise _bad(at, f"[{off:,}, {off + n:,}) reaches past the arena ({arena:,} bytes)")
            zero.append((off, n))
        maps = _int(v["map_bytes"], "layout.map_bytes", 0, io.map_lanes * (io.map_window_bytes + costmodel.MAP_PAGE))
        return Layout(arena, regions, staging, segs, tuple(zero), ring, maps)

    def _costs(self, v) -> Costs:
        # plans saved before `disk_byte_s` or `link_byte_s` have the built-in ones
        _obj(v, "costs", [k for k in Costs._fields if k not in _LATER_COSTS or type(v) is not dict or k in v])
        vals = []
        for k in Costs._fields[1:]:
            x = v.get(k, Costs._field_defaults.get(k))
            if type(x) not in (int, float) or not 0 < x < 1 or x != x:  # 0: a term left out of the prediction
                raise _bad(f"costs.{k}", f"must be seconds above 0 and below 1, got {_shown(x)}")
            vals.append(float(x))
        return Costs(_str(v["source"], "costs.source"), *vals)

    def _refusal(self, v) -> Refusal:
        _obj(v, "refusal", Refusal._fields)
        code = _str(v["code"], "refusal.code")
        if code not in _PLAN_REFUSALS:  # admission records only these; any other is not a plan's
            raise _bad("refusal.code", f"must be one of {', '.join(_PLAN_REFUSALS)}, got {_shown(code)}")
        return Refusal(Code(code), _int(v["run"], "refusal.run", 0, _MAX),
                       _str(v["step"], "refusal.step"), _int(v["needed_bytes"], "refusal.needed_bytes", 0, _MAX),
                       _int(v["allowed_bytes"], "refusal.allowed_bytes", 0, _MAX), _str(v["message"], "refusal.message"))

    # -- tensors and parts ----------------------------------------------------------------------
    def _tensors(self, v, lay: Layout) -> tuple[Tensor, ...]:
        out, prev = [], None
        fields = _TENSOR.bind()
        fast, slow = fields.fast, fields.slow
        for k, t in enumerate(_list(v, "tensors")):
            at = f"tensors[{k}]"
            if fast(t) and shape_ok(t[2]):
                name, dtype, shape, off, nbytes = t
                shape = tuple(shape)
            else:  # the field-by-field check, which names what is wrong
                name, dtype, shape, off, nbytes = slow(t, at)
            if prev is not None and name <= prev:
                raise _bad(f"{at}.name", f"tensors must be sorted by name, without repeats ({_shown(name)} after {_shown(prev)})")
            prev = name
            want = _nbytes_of(dtype, shape, f"{at}.shape")
            if nbytes != want:
                raise _bad(f"{at}.nbytes", f"is {nbytes:,}, but {dtype} x {list(shape)} is {want:,} bytes")
            if off + nbytes > lay.arena_bytes:
                raise _bad(f"{at}.offset_bytes", f"[{off:,}, {off + nbytes:,}) reaches past the arena "
                                                 f"({lay.arena_bytes:,} bytes)")
            if off % max(1, DTYPES[dtype].itemsize):
                raise _bad(f"{at}.offset_bytes", f"{off:,} is not aligned to {dtype}'s element size")
            out.append(Tensor(name, dtype, shape, off, nbytes))
        spans = sorted((t.offset_bytes, t.offset_bytes + t.nbytes, t.name) for t in out if t.nbytes)
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1]:
                raise _bad("tensors", f"{_shown(a[2])} and {_shown(b[2])} overlap in the arena")
        return tuple(out)

    def _parts(self, v, tensors, files) -> tuple[Part, ...]:
        reasons = self.reasons
        fields = _PART.bind(tensors=len(tensors), reasons=len(reasons))
        fast, slow = fields.fast, fields.slow
        self.inputs = _INPUT.bind(sources=len(self.sources), files=len(files))
        out, labels, semantics = [], set(), set()
        for pid, p in enumerate(_list(v, "parts")):
            ti, index, op, path, ri, raw_inputs, off, out_bytes, out_dtype, landing, host, block, zero, ggml, add, \
                unpermute, dst = p if fast(p) else slow(p, f"parts[{pid}]")
            t, reason = tensors[ti], reasons[ri]
            name = t.name
            inputs = (self._input(raw_inputs[0], pid, 0, files),) if len(raw_inputs) == 1 else \
                tuple(self._input(x, pid, k, files) for k, x in enumerate(raw_inputs))
            if out_dtype != t.dtype:
                raise _bad(f"parts[{pid}].out_dtype", f"is {out_dtype}, its tensor {_shown(name)} is {t.dtype}")
            if dst != t.offset_bytes + off:
                raise _bad(f"parts[{pid}].dst_offset",
                           f"is {dst:,}, but its tensor starts at {t.offset_bytes:,} and the part "
                                               f"at offset {off:,} in it")
            if off + out_bytes + zero > t.nbytes:
                raise _bad(f"parts[{pid}].out_bytes", f"[{off:,}, {off + out_bytes + zero:,}) reaches past its tensor "
                                              f"({t.nbytes:,} bytes)")
            label = (ti, index)
            if label in labels:  # the label names the part's steps: step ids are unique
                raise _bad(f"parts[{pid}].index", f"part {_shown(f'{name}#{index}')} is listed twice")
            labels.add(label)
            part = new(Part, (pid, name, index, op, path, reason, inputs, off, out_bytes, out_dtype, landing, host,
                              block, zero, ggml, add, unpermute, dst))
            # Whether a part's sizes follow from its op depends on these fields only; parts that share
            # them (the experts of a layer, the layers of a model) are checked once.
            w = inputs[0]
            sc = tuple((x.role, x.dtype, x.shape, x.nbytes) for x in inputs[1:]) or None
            key = (op, path, out_dtype, out_bytes, landing, host, block, ggml, add, unpermute, w.role, w.dtype, w.shape,
                   w.nbytes, sc)
            if key not in semantics:
                self._part_semantics(part, f"parts[{pid}]")
                semantics.add(key)
            out.append(part)
        return tuple(out)

    def _input(self, i, pid: int, k: int, files) -> Input:
        fields = self.inputs
        if fields.fast(i) and shape_ok(i[6]):
            role, tensor, fi, start, nbytes, dtype, shape, seg, stride, count = i
            shape = tuple(shape)
        else:  # the field-by-field check, which names what is wrong
            role, tensor, fi, start, nbytes, dtype, shape, seg, stride, count = fields.slow(i, f"parts[{pid}].inputs[{k}]")
        f = files[fi]
        want = _NBYTES.get((dtype, shape)) or _nbytes_of(dtype, shape, f"parts[{pid}].inputs[{k}].shape")
        if nbytes != want:
            raise _bad(f"parts[{pid}].inputs[{k}].nbytes",
                       f"is {nbytes:,}, but {dtype} x {list(shape)} is {want:,} bytes")
        if count > 1:
            if seg * count != nbytes or stride < seg:
                raise _bad(f"parts[{pid}].inputs[{k}].seg",
                           f"{count:,} segments of {seg:,} bytes, {stride:,} apart, do not make "
                                        f"{nbytes:,} bytes")
            end = start + (count - 1) * stride + seg
        else:
            end = start + nbytes
        if end > f.size_bytes:
            raise _bad(f"parts[{pid}].inputs[{k}].start",
                       f"reads [{start:,}, {end:,}) of {_shown(f.path)}, which has {f.size_bytes:,} bytes")
        return new(Input, (role, self.sources[tensor], f.path, start, nbytes, dtype, shape, seg, stride, count))

    def _part_semantics(self, n: Part, at: str) -> None:
        """The sizes the executor allocates and converts by must follow from the part's inputs."""
        w = n.inputs[0]
        why = op_problem(n.op, n.path, w.dtype, n.out_dtype, n.inputs[1].dtype if len(n.inputs) >= 2 else None,
                         n.add != 0.0)
        if why:  # the table the compiler chooses ops by: nothing else has a kernel or a host routine
            raise _bad(f"{at}.out_dtype", f"a {n.op} on the {n.path} path {why}")
        if n.unpermute and n.op != "gguf":
            raise _bad(f"{at}.unpermute", f"only a gguf dequantization writes rows in transformers' order, not a {n.op}")
        if n.ggml or n.op == "gguf":
            return CHECKS["gguf"].part(n, at)
        fmt = fp4.format_of(w.dtype, n.inputs[1].dtype) if len(n.inputs) >= 2 else None
        if fmt and n.op in DEQUANTIZE_OPS:
            return CHECKS[fmt].part(n, at)
        if w.role != "weight" or (len(n.inputs) == 2) != (n.op == "dequantize") or len(n.inputs) > 2 or (
                len(n.inputs) == 2 and n.inputs[1].role != "scale"):
            raise _bad(f"{at}.inputs", f"a {n.op} part reads a weight" + (" and its scale" if n.op == "dequantize" else ""))
        numel = math.prod(w.shape)
        want = DTYPES[n.out_dtype].nbytes(numel)
        if n.op == "copy" and w.dtype != n.out_dtype:
            raise _bad(f"{at}.out_dtype", f"a copy keeps its dtype ({w.dtype}), got {n.out_dtype}")
        if n.out_bytes != want:
            raise _bad(f"{at}.out_bytes", f"is {n.out_bytes:,}, but {numel:,} elements of {n.out_dtype} are {want:,} bytes")
        if n.op in ("dequantize", "transpose"):
            if len(w.shape) != 2:
                raise _bad(f"{at}.inputs[0].shape", f"a {n.op} needs a 2-D weight, got {list(w.shape)}")
        if n.op == "dequantize":
            rows, cols = w.shape
            if n.block <= 0:
                raise _bad(f"{at}.block", "a dequantize needs a block edge of at least 1")
            s = n.inputs[1]
            blocks = -(-rows // n.block) * -(-cols // n.block)
            if s.dtype != "F32" or s.nbytes != blocks * 4:
                raise _bad(f"{at}.inputs[1]", f"a dequantize of {rows}x{cols} by {n.block} blocks reads {blocks:,} F32 "
                                              f"scales, got {s.dtype} x {s.nbytes:,} bytes")
        reads = sum(i.nbytes for i in n.inputs)
        if n.path == "host":
            if n.op == "copy":
                raise _bad(f"{at}.path", "a pure copy takes the direct path")
            host = (reads + n.out_bytes * (2 if n.op == "transpose" and w.dtype != n.out_dtype else 1)
                    + scratch_bytes(n.op, w.dtype, n.out_dtype, n.out_bytes, DTYPES[n.out_dtype].itemsize))
            if n.host_bytes != host or n.landing_bytes:
                raise _bad(f"{at}.host_bytes", f"a host-path {n.op} holds {host:,} bytes (reads + output + scratch), got "
                                               f"{n.host_bytes:,} (and landing {n.landing_bytes:,})")
        elif n.host_bytes:
            raise _bad(f"{at}.host_bytes", f"a direct-path part holds no host bytes, got {n.host_bytes:,}")
        elif n.landing_bytes not in (0, reads):
            raise _bad(f"{at}.landing_bytes", f"is {n.landing_bytes:,}: a landing part lands its {reads:,} read bytes")
        elif n.landing_bytes != (0 if n.op == "copy" else reads) and n.op != "convert":
            # a copy goes straight to its place; a dequantize or transpose cannot run in place (its
            # source and output overlap), and only its landing bytes place its scale
            raise _bad(f"{at}.landing_bytes", f"is {n.landing_bytes:,}: a direct-path {n.op} "
                                              f"{'lands nothing' if n.op == 'copy' else f'lands its {reads:,} read bytes'}")

    # -- runs -------------------------------------------------------------------------------------
    def _runs(self, v, parts, files, io: IOSettings, lay: Layout) -> tuple[Run, ...]:
        n_f = len(FIELDS["run"])
        out, next_part, users, scatter_rows, windows = [], 0, 0, 0, []
        staging_slots = lay.staging_bytes // io.slot_bytes
        request = _REQUEST.bind(files=len(files), slot=io.slot_bytes, staging=staging_slots)
        self.copies = _COPY.bind(room=io.slot_bytes)  # a request's room is at most its slot
        kernel, host_part = _KERNEL.bind(), _HOST_PART.bind()
        for k, r in enumerate(_list(v, "runs")):
            at = f"runs[{k}]"
            _list(r, at, n_f)
            pids = _list(r[0], f"{at}.parts")
            for j, pid in enumerate(pids):
                if pid != next_part or type(pid) is not int or pid >= len(parts):
                    raise _bad(f"{at}.parts[{j}]", f"expected part {next_part} of {len(parts)} (runs list every part "
                                                   f"once, in order), got {_shown(pid)}")
                next_part += 1
            pids = tuple(pids)
            first = pids[0] if pids else next_part
            in_run = range(first, next_part)
            region = _int(r[4], f"{at}.landing_region", k % 2, k % 2)
            limits = {"arena": lay.arena_bytes, "landing": lay.landing_region_bytes[region]}
            reqs = tuple(self._request(q, at, j, request, files, io, limits, staging_slots)
                         for j, q in enumerate(_list(r[1], f"{at}.requests")))
            kernels = tuple(self._kernel(x, at, j, kernel, parts, in_run, limits)
                            for j, x in enumerate(_list(r[2], f"{at}.kernels")))
            hosts = tuple(self._host_part(h, f"{at}.host_parts[{j}]", host_part, parts, in_run, io)
                          for j, h in enumerate(_list(r[3], f"{at}.host_parts")))
            host_ids = {h.part for h in hosts}
            if len(host_ids) != len(hosts) or host_ids != {p for p in pids if parts[p].path == "host"}:
                raise _bad(f"{at}.host_parts", "must list each host-path part of the run once")
            run = Run(k, pids, reqs, kernels, hosts, region,
                      _int(r[5], f"{at}.landing_bytes", 0, lay.landing_region_bytes[region]),
                      _int(r[6], f"{at}.host_bytes", 0, _MAX), _int(r[7], f"{at}.read_bytes", 0, _MAX),
                      _int(r[8], f"{at}.payload_bytes", 0, _MAX), _int(r[9], f"{at}.requests_uncoalesced", 0, _MAX),
                      _int(r[10], f"{at}.copies_uncoalesced", 0, _MAX))
            hb = run_host_bytes(parts, hosts)
            if run.host_bytes != hb:
                raise _bad(f"{at}.host_bytes", f"is {run.host_bytes:,}, the replay of its host-path parts holds {hb:,}")
            rb = sum(q.length * q.count for q in reqs) + sum(parts[h.part].read_bytes for h in hosts)
            if run.read_bytes != rb:
                raise _bad(f"{at}.read_bytes", f"is {run.read_bytes:,}, its requests and host-path reads are {rb:,}")
            pb = sum(parts[p].read_bytes for p in pids)
            if run.payload_bytes != pb:
                raise _bad(f"{at}.payload_bytes", f"is {run.payload_bytes:,}, its parts read {pb:,}")
            users += len(reqs) + sum(h.copies for h in hosts)
            scatter_rows += sum(len(q.copies) for q in reqs if q.scatter)
            windows += [window_bytes(q.length, q.stride, q.count, io.map_window_bytes) for q in reqs if q.stride]
            out.append(run)
        if next_part != len(parts):
            raise _bad("runs", f"list parts 0..{next_part - 1}, the plan has {len(parts)}")
        ring = min(io.slots, users) * io.slot_bytes
        if lay.ring_bytes != ring:
            raise _bad("layout.ring_bytes", f"is {lay.ring_bytes:,}, the plan's requests and staging copies use "
                                            f"{ring:,} of ring")
        # A plan may claim more than its requests' windows (one written before windows were sized to
        # their requests claims a full window per lane), never less: admission counts what it claims.
        maps = map_bytes(io.workers, windows, io.map_lanes)
        bound = map_bytes_bound(io.workers, len(windows), io.map_lanes, io.map_window_bytes)
        if not maps <= lay.map_bytes <= max(maps, bound):
            raise _bad("layout.map_bytes", f"is {lay.map_bytes:,}, the plan's {len(windows):,} strided requests map "
                                           f"{maps:,} bytes at once")
        if lay.scatter_segments != scatter_rows:
            raise _bad("layout.scatter_segments", f"is {lay.scatter_segments:,}, the scattered requests have "
                                                  f"{scatter_rows:,} copies")
        return tuple(out)

    def _request(self, q, run_at, j, fields, files, io, limits, staging_slots) -> Request:
        slot = io.slot_bytes
        if (fields.fast(q) and q[4] is False and q[5] == -1 and q[6] == 1
                and ((q[7] == 0 and q[8] == 1 and q[1] % DIRECT_ALIGN == 0)
                     or (q[7] >= q[2] and q[8] <= slot // q[2]))):
            # the common request, plain or strided, not scattered: every field in range at once
            fi, off, length, raw, scatter, staging, width, stride, count = q
            room = length * count if stride else length
        else:  # the field-by-field check, which names what is wrong
            at = f"{run_at}.requests[{j}]"
            fi, off, length, raw, scatter, staging, width, stride, count = fields.slow(q, at)
            if stride:
                count = _int(count, f"{at}.count", 1, slot // length)
                if stride < length:
                    raise _bad(f"{at}.stride", f"is {stride:,}: a strided read's segments ({length:,} bytes) may not "
                                               f"overlap")
                room = length * count  # the slot bytes a strided read fills, packed
            else:
                count = _int(count, f"{at}.count", 1, 1)
                if off % DIRECT_ALIGN:
                    raise _bad(f"{at}.offset", f"{off:,} is not aligned to {DIRECT_ALIGN} bytes")
                room = length
            if scatter and not stride:
                staging = _int(staging, f"{at}.staging", 0, staging_slots - 1)
                if width not in (1, 2, 4, 8):
                    raise _bad(f"{at}.width", f"must be 1, 2, 4 or 8, got {width}")
            elif scatter:
                raise _bad(f"{at}.scatter", "a strided read is not scattered")
            else:
                staging = _int(staging, f"{at}.staging", -1, -1)
                width = _int(width, f"{at}.width", 1, 1)
        f = files[fi]
        copy = self.copies  # the slot's bounds; a copy that fails them is checked against the request's room
        copies, needed = [], 0
        for k, c in enumerate(raw):
            if copy.fast(c) and c[4] == 1 and c[5] == 0:
                so, space, dst, n, rows, pitch = c
            else:  # the field-by-field check, which names what is wrong
                ca = f"{run_at}.requests[{j}].copies[{k}]"
                so, space, dst, n, rows, pitch = _COPY.bind(room=room).slow(c, ca)
                if rows == 1:
                    pitch = _int(pitch, f"{ca}.pitch", 0, 0)
                elif stride or scatter:
                    raise _bad(f"{ca}.rows", "only a whole-row request has 2-D copies")
                else:
                    pitch = _int(pitch, f"{ca}.pitch", n, room)
            end = so + (rows - 1) * pitch + n
            if end > room:
                raise _bad(f"{run_at}.requests[{j}].copies[{k}]", f"slot range [{so:,}, {end:,}) reaches past the "
                                                                  f"request's {room:,} bytes")
            if dst + n * rows > limits[space]:
                raise _bad(f"{run_at}.requests[{j}].copies[{k}]", f"{space} range [{dst:,}, {dst + n * rows:,}) "
                                                                  f"reaches past the {space} ({limits[space]:,} bytes)")
            if scatter and (space != "arena" or so % width or dst % width or n % width):
                raise _bad(f"{run_at}.requests[{j}].copies[{k}]", f"a scattered copy goes to the arena in whole "
                                                                  f"{width}-byte elements")
            if end > needed:
                needed = end
            copies.append(new(Copy, (so, space, dst, n, rows, pitch)))
        if stride:
            top = off + (count - 1) * stride + length
            if top > f.size_bytes:  # a mapped read must find every byte in the file
                raise _bad(f"{run_at}.requests[{j}]", f"reads [{off:,}, {top:,}) of {_shown(f.path)}, which has "
                                                      f"{f.size_bytes:,} bytes")
        elif off + needed > f.size_bytes:
            raise _bad(f"{run_at}.requests[{j}]", f"reads [{off:,}, {off + needed:,}) of {_shown(f.path)}, which has "
                                                  f"{f.size_bytes:,} bytes")
        return new(Request, (f.path, off, length, tuple(copies), scatter, staging, width, stride, count))

    def _kernel(self, x, run_at, j, fields, parts, in_run, limits) -> Kernel:
        def at(field: str = "") -> str:  # the field path, formatted only for an error
            return f"{run_at}.kernels[{j}]{field}"

        if fields.fast(x) and not x[12]:
            pid, op, src_dtype, dst_dtype, space, src, scale, dst, numel, rows, cols, block, more, fmt, add, unpermute = x
            more = ()
        else:  # the field-by-field check, which names what is wrong
            pid, op, src_dtype, dst_dtype, space, src, scale, dst, numel, rows, cols, block, more, fmt, add, unpermute = \
                fields.slow(x, at())
            more = tuple(_int(v, at(f".more[{m}]"), 0, _MAX) for m, v in enumerate(more))
        if pid in in_run:  # the format the part's op and inputs decide (a part outside the run is named below)
            p0 = parts[pid]
            want = kernel_format(op, p0.inputs[0].dtype, p0.inputs[1].dtype if len(p0.inputs) >= 2 else None)
            if fmt != want:
                raise _bad(at(".format"), f"is {_shown(fmt)}, but a {op} of part {pid}'s {p0.inputs[0].dtype} "
                                          f"input is a {want} kernel")
        if add and op != "convert":
            raise _bad(at(".add"), f"only a convert adds a constant, not a {op}")
        if unpermute and op != "gguf":
            raise _bad(at(".unpermute"), f"only a gguf dequantization writes rows in transformers' order, not a {op}")
        if more and op not in ("convert", "gguf"):
            raise _bad(at(".more"), f"only conversions and GGUF dequantizations of several parts share a kernel, not a {op}")
        if len(set(more)) != len(more) or pid in more:
            raise _bad(at(".more"), "lists a part twice")
        # the format's own checks: a gguf kernel's by its op (its parts are held to the run there), an
        # FP4 kernel's by its format, which was held to its part's above (a part outside the run is
        # named by the loop below)
        own = CHECKS["gguf"] if op == "gguf" else CHECKS[fmt] if fmt in fp4.FORMATS and pid in in_run else None
        if own is not None:
            k = new(Kernel, (pid, op, src_dtype, dst_dtype, space, src, scale, dst, numel, rows, cols, block, more, fmt,
                             add, unpermute))
            own.kernel(k, parts, in_run, at, limits)
            return k
        want_numel, want_dst = 0, dst
        for q in (pid, *more):
            if q not in in_run:
                raise _bad(at(".part"), f"part {q} is not a part of this run")
            p = parts[q]
            if p.path != "direct":
                raise _bad(at(".part"), f"part {q} takes the host path; its work is not a device kernel")
            w = p.inputs[0]
            if op != p.op or src_dtype != w.dtype or dst_dtype != p.out_dtype or want_dst != p.dst_offset \
                    or add != p.add:
                raise _bad(at(), f"does not match part {q} ({p.op} {w.dtype} -> {p.out_dtype} at arena "
                               f"{p.dst_offset:,}" + (f", adding {p.add:g}" if p.add else "") + ")")
            if (op != "convert" and (rows, cols) != tuple(w.shape)) or block != p.block:
                raise _bad(at(), f"shape does not match part {q}'s input {list(w.shape)}")
            want_numel += math.prod(w.shape)
            want_dst += p.out_bytes
        if numel != want_numel:
            raise _bad(at(".numel"), f"is {numel:,}, its parts have {want_numel:,} elements")
        s_size, d_size = max(1, DTYPES[src_dtype].bits // 8), max(1, DTYPES[dst_dtype].bits // 8)
        if src + numel * s_size > limits[space]:
            raise _bad(at(".src_offset"), f"[{src:,}, {src + numel * s_size:,}) reaches past the {space} "
                                           f"({limits[space]:,} bytes)")
        if dst + numel * d_size > limits["arena"]:
            raise _bad(at(".dst_offset"), f"[{dst:,}, {dst + numel * d_size:,}) reaches past the arena")
        if op == "dequantize":
            if scale is None or block <= 0:
                raise _bad(at(".scale_offset"), "a dequantize reads its scale from the landing region")
            n_scale = -(-rows // block) * -(-cols // block) * 4
            if scale + n_scale > limits["landing"]:
                raise _bad(at(".scale_offset"), f"[{scale:,}, {scale + n_scale:,}) reaches past the landing region "
                                                 f"({limits['landing']:,} bytes)")
        elif scale is not None:
            raise _bad(at(".scale_offset"), f"a {op} reads no scale")
        if op == "convert" and space == "arena" and DTYPES[src_dtype].bits != DTYPES[dst_dtype].bits:
            raise _bad(at(), "only a same-size conversion runs in place in the arena")
        return new(Kernel, (pid, op, src_dtype, dst_dtype, space, src, scale, dst, numel, rows, cols, block, more, fmt,
                            add, 0))

    def _host_part(self, h, at, fields, parts, in_run, io) -> HostPart:
        pid, dst, copies = h if fields.fast(h) else fields.slow(h, at)
        if pid not in in_run or parts[pid].path != "host":
            raise _bad(f"{at}.part", f"part {pid} is not a host-path part of this run")
        p = parts[pid]
        if dst != p.dst_offset:
            raise _bad(f"{at}.dst_offset", f"is {dst:,}, part {pid} goes to {p.dst_offset:,}")
        want = -(-p.out_bytes // io.slot_bytes)
        if copies != want:
            raise _bad(f"{at}.copies", f"is {copies:,}, part {pid}'s {p.out_bytes:,} bytes take {want:,} slot copies")
        return HostPart(pid, dst, copies)

    # -- the decision -----------------------------------------------------------------------------
    def _decision(self, plan: Plan) -> Plan:
        tl = admit(plan)
        if plan.peak != tl.peak:
            raise _bad("peak", f"recorded {plan.peak.host_bytes:,} host / {plan.peak.device_bytes:,} device bytes, "
                               f"the replay of the plan gives {tl.host_peak_bytes:,} / {tl.device_peak_bytes:,}")
        if plan.refusal != tl.refusal:
            got = "none" if tl.refusal is None else f"{tl.refusal.code} at run {tl.refusal.run}"
            had = "none" if plan.refusal is None else f"{plan.refusal.code} at run {plan.refusal.run}"
            raise _bad("refusal", f"recorded {had}, the replay of the plan against its budget gives {got}")
        return plan.with_decision(tl)


def _coverage(plan: Plan) -> None:
    """Every byte lands where its part says, once: what makes a decoded plan load bit-exact.

    - each tensor is tiled by its parts (output and padding), without gap or overlap, and the
      zero-filled regions are exactly the parts' padding;
    - each direct-path part of a run has the kernel its op needs (none for a copy), reading its
      landing bytes from ranges no other part of the run uses;
    - each copy of a request carries file bytes [offset + slot_offset, + nbytes) to the place its part
      maps them to (the arena for a pure copy, the landing range its kernel reads otherwise), and the
      copies of a run tile every direct-path input segment exactly.
    """
    from bisect import bisect_right

    parts = plan.parts
    spans: dict = {}
    for p in parts:
        spans.setdefault(p.tensor, []).append((p.offset_bytes, p.offset_bytes + p.out_bytes + p.zero_bytes, p.id))
    for k, t in enumerate(plan.tensors):
        pos = 0
        for a, b, pid in sorted(spans.get(t.name, ())):
            if a != pos:
                raise _bad(f"parts[{pid}].offset_bytes", f"tensor {_shown(t.name)} is not tiled by its parts: "
                                                        f"bytes [{min(a, pos):,}, {max(a, pos):,}) are "
                                                        f"{'covered twice' if a < pos else 'covered by no part'}")
            pos = b
        if pos != t.nbytes:
            raise _bad(f"tensors[{k}]", f"its parts cover {pos:,} of its {t.nbytes:,} bytes")
    zero = tuple((p.dst_offset + p.out_bytes, p.zero_bytes) for p in parts if p.zero_bytes)
    if plan.layout.zero != zero:
        raise _bad("layout.zero", "must list the parts' zero padding, in part order")
    for r in plan.runs:
        _run_coverage(r, parts, bisect_right)


def _run_coverage(r, parts, bisect_right) -> None:
    at = f"runs[{r.index}]"
    kern: dict = {}  # part -> (source space, source offset, scale offset) of its kernel
    for j, k in enumerate(r.kernels):
        src = k.src_offset
        for pid in k.parts:
            if pid in kern:
                raise _bad(f"{at}.kernels[{j}]", f"part {pid} has a second kernel")
            kern[pid] = (k.src_space, src, k.scale_offset)
            src += parts[pid].read_bytes
    maps = []  # (file, file start, file end, space, destination start)
    strided: list = []  # _Strided
    for pid in r.parts:
        p = parts[pid]
        if p.path == "host":
            continue
        k = kern.get(pid)
        # a tensor of no elements needs no kernel (plans compiled before 5697d19 gave a same-size
        # conversion of one a kernel in place, which runs over nothing: still accepted)
        if (k is None and p.op != "copy" and p.out_bytes > 0) or (k is not None and p.op == "copy"):
            raise _bad(f"{at}.kernels", f"part {pid} ({p.op}) {'needs a kernel' if k is None else 'needs no kernel'}")
        if p.landing_bytes == 0:
            if k is not None and (k[0] != "arena" or k[1] != p.dst_offset):
                raise _bad(f"{at}.kernels", f"part {pid} converts in place: its kernel reads its own arena bytes")
            space, bases = "arena", (p.dst_offset,)
        else:
            if k[0] != "landing":
                raise _bad(f"{at}.kernels", f"part {pid} lands its bytes: its kernel reads the landing region")
            space, bases = "landing", (k[1], k[2])
            if len(p.inputs) == 3:  # NVFP4's per-tensor scale: right after its block scales (`fp4.scale2_offset`)
                bases += (fp4.scale2_offset(k[2], p.inputs[1].nbytes),)
        for inp, base in zip(p.inputs, bases):
            if inp.count == 1:
                maps.append((inp.file, inp.start, inp.start + inp.nbytes, space, base))
            elif inp.nbytes:
                strided.append(_Strided(inp, space, base))
    maps = [m for m in maps if m[2] > m[1]]
    maps.sort()
    landing = sorted([(m[4], m[4] + m[2] - m[1]) for m in maps if m[3] == "landing"] +
                     [(x.base, x.base + x.inp.nbytes) for x in strided if x.space == "landing"])
    for (a0, a1), (b0, _) in zip(landing, landing[1:]):
        if b0 < a1:
            raise _bad(f"{at}.kernels", f"two inputs of the run share landing bytes [{b0:,}, {a1:,})")
    strided.sort(key=lambda x: (x.inp.file, x.inp.start))
    skeys = [(x.inp.file, x.inp.start) for x in strided]
    reach = max((x.end - x.inp.start for x in strided), default=0)
    keys = [(m[0], m[1]) for m in maps]
    got: list = [[] for _ in maps]
    for j, q in enumerate(r.requests):
        if q.stride:
            _strided_request(q, f"{at}.requests[{j}]", strided, skeys, bisect_right, reach)
            continue
        for c in q.copies:
            fpos, end, dst = q.offset + c.slot_offset, q.offset + c.slot_offset + c.nbytes, c.dst_offset
            if strided:
                x = _strided_at(strided, skeys, q.file, fpos, bisect_right, reach)
                if x is not None:
                    x.piece(c, fpos, f"{at}.requests[{j}]")
                    continue
            if c.rows != 1:
                raise _bad(f"{at}.requests[{j}]", f"a 2-D copy of {_shown(q.file)} bytes from {fpos:,} is not a "
                                                  f"slice of whole rows of the run's parts")
            # A copy may carry several inputs that are neighbours both in the file and at the destination.
            i = bisect_right(keys, (q.file, fpos)) - 1
            while fpos < end:
                m = maps[i] if 0 <= i < len(maps) else None
                if (m is None or m[0] != q.file or not m[1] <= fpos < m[2] or m[3] != c.space
                        or dst != m[4] + (fpos - m[1])):
                    raise _bad(f"{at}.requests[{j}]", f"a copy of {_shown(q.file)} bytes [{q.offset + c.slot_offset:,}, "
                                                      f"{end:,}) to {c.space} {c.dst_offset:,} is not where the "
                                                      f"run's parts put them")
                hi = min(end, m[2])
                got[i].append((fpos, hi))
                dst += hi - fpos
                fpos = hi
                i += 1
    for m, pieces in zip(maps, got):
        if not _tiles(pieces, m[1], m[2]):
            raise _bad(at, f"bytes [{m[1]:,}, {m[2]:,}) of {_shown(m[0])} are not copied exactly once by the run's "
                           f"requests")
    for x in strided:
        x.covered(at)


class _Strided:
    """A strided input of a run (`count` segments of `seg` bytes, `stride` apart, packed at `base`)
    and what the run's copies cover of it: runs of whole rows, and pieces of single rows."""

    __slots__ = ("inp", "space", "base", "full", "partial")

    def __init__(self, inp, space: str, base: int):
        self.inp, self.space, self.base = inp, space, base
        self.full: list = []  # (first row, end row)
        self.partial: dict = {}  # row -> [(start, end) within the segment]

    @property
    def end(self) -> int:
        i = self.inp
        return i.start + (i.count - 1) * i.stride + i.seg

    def rows(self, first: int, n: int, dst: int, space: str, at: str) -> None:
        i = self.inp
        if space != self.space or dst != self.base + first * i.seg or first + n > i.count:
            raise _bad(at, f"rows [{first:,}, {first + n:,}) of the slice of {_shown(i.tensor)} do not go where its "
                           f"part puts them")
        self.full.append((first, first + n))

    def piece(self, c: Copy, fpos: int, at: str) -> None:
        """A copy from a whole-row request: a 2-D copy of whole segments, or a 1-D piece of one."""
        i = self.inp
        row, o = divmod(fpos - i.start, i.stride)
        if c.rows > 1 or (o == 0 and c.nbytes == i.seg):
            if o or c.nbytes != i.seg or (c.rows > 1 and c.pitch != i.stride):
                raise _bad(at, f"a 2-D copy of {c.rows:,} rows of {c.nbytes:,} bytes, pitch {c.pitch:,}, does not "
                               f"take whole segments of the slice of {_shown(i.tensor)} ({i.seg:,} bytes every "
                               f"{i.stride:,})")
            self.rows(row, c.rows, c.dst_offset, c.space, at)
            return
        if o + c.nbytes > i.seg or c.space != self.space or c.dst_offset != self.base + row * i.seg + o:
            raise _bad(at, f"a copy of {c.nbytes:,} bytes at file offset {fpos:,} is not inside a segment of the "
                           f"slice of {_shown(i.tensor)} where its part puts it")
        self.partial.setdefault(row, []).append((o, o + c.nbytes))

    def covered(self, at: str) -> None:
        i = self.inp
        spans = list(self.full)
        for row, pieces in self.partial.items():
            if not _tiles(pieces, 0, i.seg):
                raise _bad(at, f"row {row:,} of the slice of {_shown(i.tensor)} is not copied exactly once")
            spans.append((row, row + 1))
        if not _tiles(spans, 0, i.count):
            raise _bad(at, f"the {i.count:,} rows of the slice of {_shown(i.tensor)} are not copied exactly once by "
                           f"the run's requests")


def _tiles(pieces, lo: int, hi: int) -> bool:
    """Whether the (start, end) pieces cover [lo, hi) exactly: no gap, no overlap."""
    pos = lo
    for a, b in sorted(pieces):
        if a != pos:
            return False
        pos = b
    return pos == hi


def _strided_at(strided: list, skeys: list, file: str, fpos: int, bisect_right, reach: int):
    """The strided input of the run one of whose segments holds file offset `fpos`, or None. Inputs
    may interleave (the halves of a GGUF head: a row every two rows, one from the head's first row,
    one from its second), so the last one starting at or before `fpos` is not enough: those that
    start within `reach` (the run's longest strided span) before it are tried, latest first."""
    k = bisect_right(skeys, (file, fpos)) - 1
    while k >= 0:
        x = strided[k]
        i = x.inp
        if i.file != file or i.start < fpos - reach:
            break
        if fpos < x.end and i.stride > 0 and (fpos - i.start) % i.stride < i.seg:
            return x
        k -= 1
    return None


def _strided_request(q, at: str, strided: list, skeys: list, bisect_right, reach: int) -> None:
    """A strided read covers whole rows of one strided input: same segment and stride, starting on
    a row, its copies tiling the packed slot bytes in order to the rows' packed destination."""
    x = _strided_at(strided, skeys, q.file, q.offset, bisect_right, reach)
    i = x.inp if x is not None else None
    if i is None or q.length != i.seg or q.stride != i.stride or (q.offset - i.start) % i.stride:
        raise _bad(at, f"a strided read of {_shown(q.file)} at {q.offset:,} ({q.count:,} x {q.length:,} bytes every "
                       f"{q.stride:,}) is not rows of a slice of the run's parts")
    first = (q.offset - i.start) // i.stride
    pos, dst, spaces = 0, None, {c.space for c in q.copies}
    for c in sorted(q.copies):
        if c.slot_offset != pos:
            break
        if dst is None:
            dst = c.dst_offset
        elif c.dst_offset != dst + pos:
            pos = -1
            break
        pos += c.nbytes
    if pos != q.length * q.count or dst is None or len(spaces) != 1:
        raise _bad(at, f"the copies of a strided read must carry its {q.length * q.count:,} packed bytes once, in "
                       f"order, to one place")
    x.rows(first, q.count, dst, spaces.pop(), at)
