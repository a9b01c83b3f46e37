"""compile: spec file -> `ir.Plan` (manifest -> bind -> graph -> schedule -> plan -> admission).

Compiling never allocates device memory and never reads tensor data: only headers.
"""

from __future__ import annotations

from pathlib import Path

from .. import __version__
from ..plan.admission import admit
from .bind import bind
from ..plan.costs import load_costs
from ..base.errors import BindError
from ..base.gcpause import gc_paused
from .graph import Graph, build_graph
from ..plan.records import Budget, Checkpoint, FileEntry, IOSettings, Layout, Peak, Plan, SpecRef, TensorParallel
from ..manifest import Manifest, read_manifest
from .schedule import Schedule, schedule
from ..spec.model import LoadedSpec, load_spec
from ..base.codes import Code


@gc_paused()
def compile_spec(spec_path: str | Path, rank: int = 0) -> Plan:
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return compile_loaded(loaded, manifest, rank)


@gc_paused()
def compile_all_ranks(spec_path: str | Path) -> list[Plan]:
    """One plan per tensor-parallel rank (the manifest is read once)."""
    loaded = load_spec(spec_path)
    manifest = read_manifest(loaded.checkpoint_path)
    return [compile_loaded(loaded, manifest, r) for r in range(loaded.spec.tensor_parallel.size)]


def device_budget(loaded: LoadedSpec, capacity=None) -> tuple[int | None, str]:
    """(`budget.device` in bytes or None, how it was found): a size as written, `auto` the named
    device's capacity (`planc.execute.device.seam.capacity`, or the `capacity(device) -> (bytes | None,
    why)` given)."""
    spec = loaded.spec
    b = spec.budget.device
    if b is None:
        return None, "unset"
    if b != "auto":
        return b, "spec"
    if capacity is None:
        from ..execute.device.seam import capacity
    return capacity(spec.device)


@gc_paused()
def compile_loaded(loaded: LoadedSpec, manifest: Manifest, rank: int = 0, capacity=None) -> Plan:
    spec = loaded.spec
    try:
        binding = bind(spec, manifest, rank)
    except BindError as e:  # rules and checkpoint disagree: name the spec the rules came from
        raise BindError(f"{loaded.path}: {e.message}", code=e.code) from None
    graph = build_graph(binding)
    sched = schedule(graph, spec.io, load_costs())
    dev_bytes, how = device_budget(loaded, capacity)
    undecided = plan_of(loaded, manifest, graph, sched, rank).with_budget(device_bytes=dev_bytes)
    from ..plan.codec import trust

    return trust(undecided.with_decision(admit(undecided)).with_notes(device_budget=how, source="compiled"))


def plan_of(loaded: LoadedSpec, manifest: Manifest, graph: Graph, sched: Schedule, rank: int = 0) -> Plan:
    """The schedule as a `Plan`, not yet admitted (no peak, no decision)."""
    spec = loaded.spec
    io = spec.io
    return Plan(
        planc=__version__,
        spec=SpecRef(loaded.path, loaded.text_sha256),
        checkpoint=Checkpoint(manifest.source, manifest.root,
                              tuple(FileEntry(s.path, s.size_bytes, s.mtime_ns) for s in manifest.shards)),
        device=spec.device,
        tensor_parallel=TensorParallel(rank, spec.tensor_parallel.size),
        budget=Budget(spec.budget.host, spec.budget.device if isinstance(spec.budget.device, int) else None),
        io=IOSettings(io.workers, io.slot, io.slots, io.run, io.direct, io.merge_gap, io.strided, io.map_window,
                       io.map_lanes),
        layout=Layout(sched.arena_bytes, tuple(sched.landing_region_bytes), sched.staging_bytes,
                      sched.scatter_segments, tuple(tuple(z) for z in sched.zero), sched.ring_bytes,
                      sched.map_bytes),
        tensors=sched.tensors,
        parts=sched.parts,
        runs=sched.runs,
        skipped=tuple(_skipped(manifest, graph)),
        peak=Peak(0, 0),
        refusal=None,
        costs=sched.costs,
    )


def _skipped(manifest: Manifest, graph: Graph):
    used = {i.tensor for n in graph.parts for i in n.inputs}
    return sorted(t.name for t in manifest.tensors if t.name not in used)


def node_checks(spec_path: str | Path, plans: list[Plan], complete: bool = False):
    """The `node.NodeCheck` of each node the `plans` (ranks of one tensor-parallel spec) fill.

    With `complete`, the other ranks of the nodes the plans touch are compiled too (`explain` of
    one rank states its node's total)."""
    from ..plan.node import check_nodes, node_ranks

    loaded = load_spec(spec_path)
    tp, budget = loaded.spec.tensor_parallel, loaded.spec.budget
    by_rank = {p.tensor_parallel.rank: p for p in plans}
    if complete and tp.size > 1:
        want = {r for ranks in node_ranks(tp.size, tp.per_node) if set(ranks) & set(by_rank) for r in ranks}
        missing = sorted(want - set(by_rank))
        if missing:
            manifest = read_manifest(loaded.checkpoint_path)
            for r in missing:
                by_rank[r] = compile_loaded(loaded, manifest, r)
    peaks = {r: p.peak.host_bytes for r, p in by_rank.items()}
    return check_nodes(peaks, tp.size, tp.per_node, budget.node_host, by_rank)
