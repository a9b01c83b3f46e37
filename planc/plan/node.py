"""node: the plans of every tensor-parallel rank -> one `NodeCheck` per node (host), and the verdict.

Each rank admits its own ring, windows and scratch against `budget.host`; ranks that share a host
also share its memory. `tensor_parallel.ranks_per_node` (k, default: every rank on one node) puts
ranks 0..k-1 on node 0, k..2k-1 on node 1, ...; a node's total is the sum of its ranks' host peaks
(each rank's peak may come at a different moment, so the sum is an upper bound on what the node
holds at once: the figure to admit by). With `budget.node_host` set, a node whose total exceeds it
is refused, naming its ranks and their bytes; the first such node in order is the refusal.
Given the ranks' plans, each node also states the predicted wall of its ranks loading at once
(`predict.predict_node`: one device per rank, the host's readers, cores and disk shared).
"""

from __future__ import annotations

from typing import NamedTuple

from ..base.units import gib
from ..base.codes import Code
from .records import Refusal


class NodeCheck(NamedTuple):
    node: int
    ranks: tuple[int, ...]
    peaks: tuple[int, ...]  # each rank's host peak, in the order of `ranks`
    total_bytes: int
    budget_bytes: int | None
    predicted: dict | None = None  # predict.predict_node of the node's ranks at once

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.total_bytes <= self.budget_bytes

    def as_dict(self) -> dict:
        return {"node": self.node, "ranks": list(self.ranks), "host_peak_bytes": list(self.peaks),
                "total_bytes": self.total_bytes, "budget_bytes": self.budget_bytes,
                "checked": self.budget_bytes is not None, "fits": self.fits,
                "predicted_wall": None if self.predicted is None else
                {"warm_seconds": self.predicted["warm_seconds"], "cold_seconds": self.predicted["cold_seconds"],
                 "note": "the node's ranks loading at once, one device each"}}


def node_ranks(size: int, per_node: int) -> list[tuple[int, ...]]:
    """The ranks of each node, in order: consecutive groups of `per_node` (the last may hold fewer)."""
    per_node = max(1, min(per_node, size))
    return [tuple(range(s, min(s + per_node, size))) for s in range(0, size, per_node)]


def node_of(rank: int, per_node: int) -> int:
    return rank // max(1, per_node)


def check_nodes(host_peaks: dict[int, int], size: int, per_node: int, budget: int | None,
                plans: dict | None = None) -> list[NodeCheck]:
    """One check per node whose every rank is in `host_peaks` (rank -> host peak bytes); with
    `plans` (rank -> Plan) holding them all, the node's predicted wall too."""
    from .predict import predict_node

    out = []
    for i, ranks in enumerate(node_ranks(size, per_node)):
        if all(r in host_peaks for r in ranks):
            peaks = tuple(host_peaks[r] for r in ranks)
            pred = predict_node([plans[r] for r in ranks]) if plans and all(r in plans for r in ranks) else None
            out.append(NodeCheck(i, ranks, peaks, sum(peaks), budget, pred))
    return out


def refusal_message(c: NodeCheck) -> str:
    shown = ", ".join(f"rank {r} {p:,}" for r, p in zip(c.ranks, c.peaks))
    return (f"refused: node {c.node} (ranks {c.ranks[0]}..{c.ranks[-1]}) needs {c.total_bytes:,} bytes "
            f"({gib(c.total_bytes)}) of host memory at its ranks' peaks together, budget.node_host allows "
            f"{c.budget_bytes:,} bytes ({gib(c.budget_bytes)}); {shown}; lower budget.host or io.slots per rank, "
            f"put fewer ranks on a node (tensor_parallel.ranks_per_node), or raise budget.node_host")


def node_refusal(c: NodeCheck) -> Refusal:
    """The refusal of a node over `budget.node_host` (no run: all its ranks together)."""
    return Refusal(Code.NODE_BUDGET, None, "node", c.total_bytes, c.budget_bytes, refusal_message(c))


def first_refused(checks: list[NodeCheck]) -> NodeCheck | None:
    return next((c for c in checks if not c.fits), None)
