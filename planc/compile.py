"""compile: spec file -> `Plan` (manifest -> bind -> graph -> schedule -> admission -> plan).

Compiling never allocates device memory and never reads tensor data: only headers.
"""

from __future__ import annotations

from pathlib import Path

from . import PLAN_FORMAT, __version__
from .admission import Timeline, admit
from .bind import bind
from .graph import Graph, build_graph
from .manifest import Manifest, read_manifest
from .plan import Plan
from .schedule import Schedule, schedule
from .spec import LoadedSpec, load_spec


def compile_spec(spec_path: str | Path, rank: int = 0) -> Plan:
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return compile_loaded(loaded, manifest, rank)


def compile_all_ranks(spec_path: str | Path) -> list[Plan]:
    """One plan per tensor-parallel rank (the manifest is read once)."""
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return [compile_loaded(loaded, manifest, r) for r in range(loaded.spec.tensor_parallel.size)]


def compile_loaded(loaded: LoadedSpec, manifest: Manifest, rank: int = 0) -> Plan:
    spec = loaded.spec
    graph = build_graph(bind(spec, manifest, rank))
    sched = schedule(graph, spec.io)
    tl = admit(spec, sched, graph)
    return Plan.from_doc(plan_doc(loaded, manifest, graph, sched, tl, rank))


def plan_doc(loaded: LoadedSpec, manifest: Manifest, graph: Graph, sched: Schedule, tl: Timeline,
             rank: int = 0) -> dict:
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
        "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset_bytes": t.offset_bytes,
                     "nbytes": t.nbytes} for t in sched.tensors],
        "parts": [_part_doc(n, sched, io.merge_gap) for n in graph.parts],
        "steps": [{"id": s.id, "kind": s.kind, "part": s.part, "host_bytes": s.host_bytes,
                   "device_bytes": s.device_bytes, "note": s.note,
                   "deps": sorted(graph.dag.predecessors(s.id))} for s in graph.steps],
        "runs": runs,
        "timeline": [{"run": w.run, "host_bytes": w.host_bytes, "device_bytes": w.device_bytes,
                      "ring_bytes": w.ring_bytes, "host_inflight_bytes": w.host_inflight_bytes,
                      "landing_bytes": w.landing_bytes, "resident_bytes": w.resident_bytes} for w in tl.windows],
        "skipped": list(_skipped(manifest, graph)),
        "totals": {
            "tensors": len(sched.tensors),
            "source_tensors": len(graph.parts),
            "payload_bytes": sum(n.read_bytes for n in graph.parts),
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


def _part_doc(n, sched: Schedule, merge_gap: int) -> dict:
    doc = {
        "id": n.id, "tensor": n.placement, "index": n.index, "op": n.op, "path": n.path, "reason": n.reason,
        "inputs": [_input_doc(i, merge_gap) for i in n.inputs],
        "dst_offset": sched.part_offsets[n.id], "out_bytes": n.out_bytes, "out_dtype": n.out_dtype,
        "landing_bytes": n.landing_bytes, "host_bytes": n.host_bytes, "block": n.block,
    }
    if n.zero_bytes:
        doc["zero_bytes"] = n.zero_bytes
    return doc


def _input_doc(i, merge_gap: int) -> dict:
    doc = {"role": i.role, "tensor": i.tensor, "file": i.file, "start": i.start, "nbytes": i.nbytes,
           "dtype": i.dtype, "shape": list(i.shape)}
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
                      "copies": [[c.slot_offset, c.space, c.dst_offset, c.nbytes] for c in q.copies],
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
