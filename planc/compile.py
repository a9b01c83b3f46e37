"""compile: spec file -> `Plan` (manifest -> bind -> graph -> schedule -> admission -> plan).

Compiling never allocates device memory and never reads tensor data: only headers.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path

from . import PLAN_FORMAT, __version__
from .admission import Timeline, admit
from .bind import bind
from .errors import BindError
from .graph import Graph, build_graph
from .manifest import Manifest, read_manifest
from .plan import Plan
from .schedule import Schedule, schedule
from .spec import LoadedSpec, load_spec


@contextmanager
def _gc_paused():
    """Compiling allocates millions of small objects and makes no reference cycles: the cyclic
    collector would walk them over and over and free nothing (40% of the time at 90k tensors)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # Hand what survives (the plan) to the oldest generation as it is: re-enabled with a
            # million young objects, the collector would first walk them all once more (~0.15 s).
            gc.freeze()
            gc.unfreeze()
            gc.enable()


@_gc_paused()
def compile_spec(spec_path: str | Path, rank: int = 0) -> Plan:
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return compile_loaded(loaded, manifest, rank)


@_gc_paused()
def compile_all_ranks(spec_path: str | Path) -> list[Plan]:
    """One plan per tensor-parallel rank (the manifest is read once)."""
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return [compile_loaded(loaded, manifest, r) for r in range(loaded.spec.tensor_parallel.size)]


@_gc_paused()
def compile_loaded(loaded: LoadedSpec, manifest: Manifest, rank: int = 0) -> Plan:
    spec = loaded.spec
    try:
        binding = bind(spec, manifest, rank)
    except BindError as e:  # rules and checkpoint disagree: name the spec the rules came from
        raise BindError(f"{loaded.path}: {e.message}", code=e.code) from None
    graph = build_graph(binding)
    sched = schedule(graph, spec.io)
    tl = admit(spec, sched, graph)
    # A fresh doc: the plan takes it over. The step list (several per part) is built when the plan
    # is first saved, frozen or asked for it; explaining a plan never is.
    return Plan(plan_doc(loaded, manifest, graph, sched, tl, rank, steps=False),
                later={"steps": lambda: list(graph.steps)})


def plan_doc(loaded: LoadedSpec, manifest: Manifest, graph: Graph, sched: Schedule, tl: Timeline,
             rank: int = 0, steps: bool = True) -> dict:
    """The plan as a JSON-ready dict. Shapes, step deps and copies are the compiler's own tuples,
    not list copies of them: JSON writes both as arrays, and a plan has hundreds of thousands.
    With `steps` false, "steps" holds None, for the caller to fill in."""
    spec = loaded.spec
    io = spec.io
    runs = [_run_doc(r, graph) for r in sched.runs]
    requests = sum(len(r.requests) for r in sched.runs) + sum(
        i.count for r in sched.runs for h in r.host_parts for i in graph.parts[h.part].inputs)
    # The scatter table goes to the device once, as one more copy.
    copies = sum(r.copies for r in sched.runs) + (1 if sched.scatter_segments else 0)
    return {
        "kind": "planc-plan",
        "format": PLAN_FORMAT,
        "planc": __version__,
        "spec": {"path": loaded.path, "sha256": loaded.text_sha256},
        "checkpoint": {
            "source": manifest.source,
            "root": manifest.root,
            "files": [{"path": s.path, "size_bytes": s.size_bytes, "mtime_ns": s.mtime_ns} for s in manifest.shards],
        },
        "device": spec.device,
        "tensor_parallel": {"rank": rank, "size": spec.tensor_parallel.size},
        "budget": {"host_bytes": spec.budget.host, "device_bytes": spec.budget.device},
        "io": {"workers": io.workers, "slot_bytes": io.slot, "slots": io.slots, "run_bytes": io.run,
               "direct": io.direct, "merge_gap_bytes": io.merge_gap},
        "layout": {"arena_bytes": sched.arena_bytes, "landing_region_bytes": list(sched.landing_region_bytes),
                   "staging_bytes": sched.staging_bytes, "scatter_segments": sched.scatter_segments,
                   "zero": [list(z) for z in sched.zero],
                   "ring_bytes": sched.ring_bytes},
        "tensors": [{"name": t.name, "dtype": t.dtype, "shape": t.shape, "offset_bytes": t.offset_bytes,
                     "nbytes": t.nbytes} for t in sched.tensors],
        "parts": _part_docs(graph.parts, sched.part_offsets, io.merge_gap),
        "steps": list(graph.steps) if steps else None,  # already in the plan's form
        "runs": runs,
        "timeline": [{"run": w.run, "host_bytes": w.host_bytes, "device_bytes": w.device_bytes,
                      "ring_bytes": w.ring_bytes, "host_inflight_bytes": w.host_inflight_bytes,
                      "landing_bytes": w.landing_bytes, "resident_bytes": w.resident_bytes} for w in tl.windows],
        "skipped": list(_skipped(manifest, graph)),
        "totals": {
            "tensors": len(sched.tensors),
            "source_tensors": len(graph.parts),
            "payload_bytes": sum(r.payload_bytes for r in sched.runs),  # the runs hold every part once
            "read_bytes": sum(r["read_bytes"] for r in runs),
            "requests": requests,
            "requests_uncoalesced": sum(r.requests_uncoalesced for r in sched.runs),
            "copies": copies,
            "copies_uncoalesced": sum(r.copies_uncoalesced for r in sched.runs),
            "kernels": sum(len(r.kernels) + r.scatters for r in sched.runs),
            "scatters": sum(r.scatters for r in sched.runs),
            "resident_bytes": sum(t.nbytes for t in sched.tensors),
            "runs": len(sched.runs),
        },
        "peak": {"host_bytes": tl.host_peak_bytes, "device_bytes": tl.device_peak_bytes},
        "fits": tl.fits,
        "refusal": tl.refusal.as_dict() if tl.refusal else None,
    }


def _skipped(manifest: Manifest, graph: Graph):
    used = {i.tensor for n in graph.parts for i in n.inputs}
    return sorted(t.name for t in manifest.tensors if t.name not in used)


def _part_docs(parts, part_offsets: dict, merge_gap: int) -> list[dict]:
    out = []
    for n in parts:
        inputs = [{"role": i.role, "tensor": i.tensor, "file": i.file, "start": i.start, "nbytes": i.nbytes,
                   "dtype": i.dtype, "shape": i.shape} if i.count == 1 else _input_doc(i, merge_gap)
                  for i in n.inputs]
        doc = {
            "id": n.id, "tensor": n.placement, "index": n.index, "op": n.op, "path": n.path, "reason": n.reason,
            "inputs": inputs,
            "dst_offset": part_offsets[n.id], "out_bytes": n.out_bytes, "out_dtype": n.out_dtype,
            "landing_bytes": n.landing_bytes, "host_bytes": n.host_bytes, "block": n.block,
        }
        if n.zero_bytes:
            doc["zero_bytes"] = n.zero_bytes
        out.append(doc)
    return out


def _input_doc(i, merge_gap: int) -> dict:
    doc = {"role": i.role, "tensor": i.tensor, "file": i.file, "start": i.start, "nbytes": i.nbytes,
           "dtype": i.dtype, "shape": i.shape}
    if i.count > 1:
        gap = i.stride - i.seg
        doc.update(seg=i.seg, stride=i.stride, count=i.count,
                   read_as=("whole rows, sliced on the device" if gap <= merge_gap else "one read per segment"))
    return doc


def _run_doc(r, graph: Graph) -> dict:
    tensors = sorted({graph.parts[p].placement for p in r.parts})
    return {
        "index": r.index,
        "parts": list(r.parts),
        "tensors": len(tensors),
        "read_bytes": r.read_bytes,
        "payload_bytes": r.payload_bytes,
        "host_bytes": r.host_bytes,
        "landing_bytes": r.landing_bytes,
        "landing_region": r.landing_region,
        "requests": [{"file": q.file, "offset": q.offset, "length": q.length,
                      "copies": list(q.copies),  # each Copy is (slot_offset, space, dst_offset, nbytes)
                      **({"scatter": {"staging": q.staging, "width": q.width}} if q.scatter else {})}
                     for q in r.requests],
        "kernels": [{"part": k.part, "op": k.op, "src_dtype": k.src_dtype, "dst_dtype": k.dst_dtype,
                     "src_space": k.src_space, "src_offset": k.src_offset, "scale_offset": k.scale_offset,
                     "dst_offset": k.dst_offset, "numel": k.numel, "rows": k.rows, "cols": k.cols,
                     "block": k.block} for k in r.kernels],
        "host_parts": [{"part": h.part, "dst_offset": h.dst_offset, "copies": h.copies} for h in r.host_parts],
        "requests_uncoalesced": r.requests_uncoalesced,
        "copies_uncoalesced": r.copies_uncoalesced,
    }
