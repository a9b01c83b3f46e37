"""Decoding a plan file: today's checker against a typed-record decoder (msgspec), on a 91k plan.

    python bench/plan_decode.py OUT_DIR [--size 91k] [--repeat 5]

Writes compile_scale's DeepSeek-V3-shaped sparse checkpoint and its spec into OUT_DIR (once) and
compiles its plan file (about 24 MB at 91k), then times in this one process, warm, the median of
`--repeat` runs of each:

* today's `decode` (`planc.plan.codec.decode`), and its two halves: the orjson parse
  (`codec._fast_parse`) and the checks (`check.check` of the parsed document);
* inside the checks, the two passes that only relate records to one another and can be timed on
  their own: `check._coverage` (tiling, copies against parts) and the admission replay
  (`_Checker._decision`); the rest (`plan - coverage - replay`) is the per-record pass, where the
  type and range checks and the cross-record ones (ids into the tables, nbytes = dtype x shape,
  reads inside their file, part semantics, kernels against their parts, run sums) are interleaved;
* msgspec's decode of the same bytes into `msgspec.Struct` records (`array_like=True` for the
  array records, `Meta(ge, le)` ranges and `Literal` enums as check.py's limits say): the type
  and range checks only;
* msgspec's untyped parse (`msgspec.json.decode` to lists and dicts), beside orjson's;
* building the plan's records (`records.py` named tuples, names resolved from the index tables)
  from the msgspec structs with no check at all: what a typed decoder still has to do before the
  cross-record checks, a lower bound of its per-record pass.

Then it prints one msgspec error for a bad field (`parts[12].inputs[0].nbytes` = -1) beside
today's message for the same fault. Without msgspec installed it says so and exits 0.
"""


import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Literal, Optional, Union

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _median(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def plan_file(out: Path, size: str) -> Path:
    from compile_scale import VARIANTS, _nbytes, tensors, write_variant
    from planc.compiler.compile import compile_spec
    from planc.plan.codec import save_plan

    full = sum(_nbytes(dt, s) for _, dt, s in tensors(VARIANTS["91k"]))
    spec, _, _ = write_variant(out, VARIANTS[size], full)
    path = out / f"dsv3-{size}.plan.json"
    if not path.exists() or path.stat().st_mtime < spec.stat().st_mtime:
        save_plan(compile_spec(spec), path)
    return path


def typed_records():
    """The plan file's records as msgspec structs: types, constant ranges and enums (check.py's)."""
    import msgspec
    from msgspec import Meta, Struct
    from typing import Annotated

    from planc.base.dtypes import DTYPES
    from planc.base.formats import FORMATS
    from planc.base.limits import (MAX_BLOCK, MAX_DIM, MAX_DIMS, MAX_MAP_LANES, MAX_MAP_WINDOW, MAX_SLOT,
                                   MAX_SLOTS, MAX_TP, MAX_WORKERS, MIN_MAP_WINDOW)
    from planc.base.units import MAX_BYTES
    from planc.plan.check import _GGML, _ROLES
    from planc.plan.costs import STRIDED_MODES
    from planc.plan.records import DIRECT_MODES, KERNEL_OPS, OPS, PATHS, SPACES

    Nat = Annotated[int, Meta(ge=0, le=MAX_BYTES)]
    Pos = Annotated[int, Meta(ge=1, le=MAX_BYTES)]
    Dim = Annotated[int, Meta(ge=0, le=MAX_DIM)]
    Shape = Annotated[list[Dim], Meta(max_length=MAX_DIMS)]
    Block = Annotated[int, Meta(ge=0, le=MAX_BLOCK)]
    HeadRows = Annotated[int, Meta(ge=0, le=1 << 16)]
    Dtype = Literal[tuple(DTYPES)]
    Op, KernelOp, Path_, Space = Literal[OPS], Literal[KERNEL_OPS], Literal[PATHS], Literal[SPACES]
    Ggml, Role, Format = Literal[_GGML], Literal[_ROLES], Literal[FORMATS]
    Seconds = Annotated[float, Meta(gt=0, lt=1)]

    class Arr(Struct, array_like=True, forbid_unknown_fields=True):
        pass

    class Obj(Struct, forbid_unknown_fields=True):
        pass

    class FileEntry(Arr):
        path: str
        size_bytes: Nat
        mtime_ns: Annotated[int, Meta(ge=-MAX_BYTES, le=MAX_BYTES)]

    class Tensor(Arr):
        name: str
        dtype: Dtype
        shape: Shape
        offset_bytes: Nat
        nbytes: Nat

    class Input(Arr):
        role: Role
        source_index: Nat
        file_index: Nat
        start: Nat
        nbytes: Nat
        dtype: Dtype
        shape: Shape
        seg: Nat
        stride: Nat
        count: Pos

    class Part(Arr):
        tensor_index: Nat
        index: Nat
        op: Op
        path: Path_
        reason_index: Nat
        inputs: Annotated[list[Input], Meta(min_length=1, max_length=3)]
        offset_bytes: Nat
        out_bytes: Nat
        out_dtype: Dtype
        landing_bytes: Nat
        host_bytes: Nat
        block: Block
        zero_bytes: Nat
        ggml: Ggml
        add: float
        unpermute: HeadRows
        dst_offset: Nat

    class Copy(Arr):
        slot_offset: Nat
        space: Space
        dst_offset: Nat
        nbytes: Pos
        rows: Pos
        pitch: Nat

    class Request(Arr):
        file_index: Nat
        offset: Nat
        length: Pos
        copies: list[Copy]
        scatter: bool
        staging: Annotated[int, Meta(ge=-1, le=MAX_SLOTS)]
        width: Literal[1, 2, 4, 8]
        stride: Nat
        count: Pos

    class Kernel(Arr):
        part: Nat
        op: KernelOp
        src_dtype: Dtype
        dst_dtype: Dtype
        src_space: Space
        src_offset: Nat
        scale_offset: Optional[Nat]
        dst_offset: Nat
        numel: Nat
        rows: Nat
        cols: Nat
        block: Block
        more: list[Nat]
        format: Format
        add: float
        unpermute: HeadRows

    class HostPart(Arr):
        part: Nat
        dst_offset: Nat
        copies: Nat

    class Run(Arr):
        parts: list[Nat]
        requests: list[Request]
        kernels: list[Kernel]
        host_parts: list[HostPart]
        landing_region: Literal[0, 1]
        landing_bytes: Nat
        host_bytes: Nat
        read_bytes: Nat
        payload_bytes: Nat
        requests_uncoalesced: Nat
        copies_uncoalesced: Nat

    class SpecRef(Obj):
        path: str
        sha256: str

    class Checkpoint(Obj):
        source: str
        root: str
        files: list[FileEntry]

    class TensorParallel(Obj):
        rank: Annotated[int, Meta(ge=0, le=MAX_TP - 1)]
        size: Annotated[int, Meta(ge=1, le=MAX_TP)]

    class Budget(Obj):
        host_bytes: Nat
        device_bytes: Optional[Nat]

    class IOSettings(Obj):
        workers: Annotated[int, Meta(ge=1, le=MAX_WORKERS)]
        slot_bytes: Annotated[int, Meta(ge=4096, le=MAX_SLOT, multiple_of=4096)]
        slots: Annotated[int, Meta(ge=1, le=MAX_SLOTS)]
        run_bytes: Pos
        direct: Literal[DIRECT_MODES]
        merge_gap_bytes: Nat
        strided: Literal[STRIDED_MODES]
        map_window_bytes: Annotated[int, Meta(ge=MIN_MAP_WINDOW, le=MAX_MAP_WINDOW)]
        map_lanes: Annotated[int, Meta(ge=1, le=MAX_MAP_LANES)]

    class Layout(Obj):
        arena_bytes: Nat
        landing_region_bytes: tuple[Nat, Nat]
        staging_bytes: Nat
        scatter_segments: Nat
        zero: list[tuple[Nat, Nat]]
        ring_bytes: Nat
        map_bytes: Nat

    class Peak(Obj):
        host_bytes: Nat
        device_bytes: Nat

    class Refusal(Obj):
        code: Literal["host-budget", "device-budget"]
        run: Nat
        step: str
        needed_bytes: Nat
        allowed_bytes: Nat
        message: str

    class Costs(Obj):
        source: str
        page_s: Seconds
        copy_byte_s: Seconds
        read_byte_s: Seconds
        request_s: Seconds
        disk_byte_s: Seconds = 5.56e-10

    class PlanDoc(Obj):
        kind: Literal["planc-plan"]
        format: Literal[8]
        planc: str
        fields: dict[str, list[str]]
        spec: SpecRef
        checkpoint: Checkpoint
        device: str
        tensor_parallel: TensorParallel
        budget: Budget
        io: IOSettings
        layout: Layout
        tensors: list[Tensor]
        reasons: list[str]
        sources: list[str]
        parts: list[Part]
        runs: list[Run]
        skipped: list[str]
        peak: Peak
        refusal: Optional[Refusal]
        costs: Costs

    return msgspec.json.Decoder(PlanDoc)


def to_records(doc):
    """The plan's `records.py` tuples from the decoded structs, names resolved, nothing checked."""
    from planc.plan import records as R

    new = tuple.__new__
    files = [f.path for f in doc.checkpoint.files]
    tensors = tuple(new(R.Tensor, (t.name, t.dtype, tuple(t.shape), t.offset_bytes, t.nbytes)) for t in doc.tensors)
    reasons, sources = doc.reasons, doc.sources
    parts = tuple(new(R.Part, (pid, tensors[p.tensor_index].name, p.index, p.op, p.path, reasons[p.reason_index],
                               tuple(new(R.Input, (i.role, sources[i.source_index], files[i.file_index], i.start,
                                                   i.nbytes, i.dtype, tuple(i.shape), i.seg, i.stride, i.count))
                                     for i in p.inputs),
                               p.offset_bytes, p.out_bytes, p.out_dtype, p.landing_bytes, p.host_bytes, p.block,
                               p.zero_bytes, p.ggml, p.add, p.unpermute, p.dst_offset))
                  for pid, p in enumerate(doc.parts))
    runs = tuple(new(R.Run, (k, tuple(r.parts),
                             tuple(new(R.Request, (files[q.file_index], q.offset, q.length,
                                                   tuple(new(R.Copy, (c.slot_offset, c.space, c.dst_offset, c.nbytes,
                                                                      c.rows, c.pitch)) for c in q.copies),
                                                   q.scatter, q.staging, q.width, q.stride, q.count))
                                   for q in r.requests),
                             tuple(new(R.Kernel, (x.part, x.op, x.src_dtype, x.dst_dtype, x.src_space, x.src_offset,
                                                  x.scale_offset, x.dst_offset, x.numel, x.rows, x.cols, x.block,
                                                  tuple(x.more), x.format, x.add, x.unpermute)) for x in r.kernels),
                             tuple(new(R.HostPart, (h.part, h.dst_offset, h.copies)) for h in r.host_parts),
                             r.landing_region, r.landing_bytes, r.host_bytes, r.read_bytes, r.payload_bytes,
                             r.requests_uncoalesced, r.copies_uncoalesced))
                 for k, r in enumerate(doc.runs))
    return tensors, parts, runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", default="91k")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    try:
        import msgspec
    except ImportError:
        print("plan_decode: msgspec is not installed (pip install msgspec); nothing measured")
        return 0
    import orjson

    from planc.base.gcpause import gc_paused
    from planc.plan import check as C
    from planc.plan import codec

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = plan_file(out, a.size)
    raw = path.read_bytes()
    n = a.repeat
    print(f"plan {path} {len(raw):,} bytes; python {sys.version.split()[0]}, msgspec {msgspec.__version__}, "
          f"orjson {orjson.__version__}, {os.cpu_count()} CPUs; median of {n}, one process, warm")

    rows = []

    def timed(label, fn):
        with gc_paused():  # as `decode` runs
            fn()  # warm
            t, res = _median(fn, n)
        rows.append((label, t))
        print(f"  {label:<58} {t:7.3f} s", flush=True)
        return res

    timed("decode (today: parse + checks + replay)", lambda: codec.decode(raw))
    doc = timed("  orjson parse (codec._fast_parse)", lambda: codec._fast_parse(raw))
    plan = timed("  checks (check.check of the parsed document)", lambda: C.check(doc, "plan"))
    timed("    of which _coverage (cross-record)", lambda: C._coverage(plan))
    checker = C._Checker("plan")
    timed("    of which admission replay (_decision)", lambda: checker._decision(plan))
    dec = typed_records()
    typed = timed("msgspec typed decode (types, ranges, enums)", lambda: dec.decode(raw))
    timed("msgspec untyped parse (lists and dicts)", lambda: msgspec.json.decode(raw))
    timed("records.py tuples from the structs (no checks)", lambda: to_records(typed))
    t = dict(rows)
    check_s = t["  checks (check.check of the parsed document)"]
    cov = t["    of which _coverage (cross-record)"]
    rep = t["    of which admission replay (_decision)"]
    rec_pass = check_s - cov - rep
    typed_s = t["msgspec typed decode (types, ranges, enums)"]
    build = t["records.py tuples from the structs (no checks)"]
    print(f"  per-record pass of check.py (checks - coverage - replay)   {rec_pass:7.3f} s")
    print(f"  typed pipeline, lower bound (msgspec + tuples + coverage + replay, without the interleaved "
          f"cross-record checks): {typed_s + build + cov + rep:.3f} s against today's "
          f"{t['decode (today: parse + checks + replay)']:.3f} s")

    # One bad field: parts[12].inputs[0].nbytes = -1.
    bad = orjson.loads(raw)
    bad["parts"][12][5][0][4] = -1
    text = orjson.dumps(bad)
    try:
        dec.decode(text)
    except msgspec.ValidationError as e:
        print(f"msgspec:  {e}")
    try:
        codec.decode(text, "plan.json")
    except Exception as e:
        print(f"today:    {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
