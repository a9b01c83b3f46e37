"""predict: Plan -> its load's predicted wall time, warm and cold page cache, with where each figure came from.

The load is a pipeline: readers fill ring slots while the copy stream empties them onto the device,
two runs in flight. Its wall is the fixed costs before the first read, plus the slower of the two
streams, plus the part of the faster that cannot overlap (about one run's share of it):

    wall = fixed + max(read, link) + min(read, link) / runs
    fixed = start_s + ring_bytes * pin_byte_s     (the process's setup, then pinning the ring)
    read (warm) = for each request: whole, length * read_byte_s + request_s;
                  strided through a mapping, pages * page_s + bytes * copy_byte_s (`costmodel`)
                  + host-path input bytes * read_byte_s + their output bytes * host_byte_s
    read (cold) = every byte read from disk at disk_byte_s, + request_s per request
    link = payload bytes * link_byte_s

The read figures are the plan's own (`plan.costs`: the `planc probe` file it was compiled with, or
the built-in `DEFAULTS`); the link, disk, host-conversion and fixed figures are built in (`FIXED`,
measured on an H200 host, docs/benchmarks.md): `planc probe` does not measure them yet. The
result says which figures came from where, and a plan compiled with default costs says so.
"""

from __future__ import annotations

from typing import NamedTuple

from .costs import DEFAULTS, pages_touched
from .records import Plan


class Fixed(NamedTuple):
    """Figures planc probe does not measure (yet): the H200 host of docs/benchmarks.md."""

    source: str
    link_byte_s: float  # pinned host -> device: 55.4 GB/s
    disk_byte_s: float  # cold page cache, O_DIRECT, disk bound: 1.7-1.9 GB/s
    host_byte_s: float  # a host-path conversion (numpy / ml_dtypes), per output byte: about 1 GB/s
    start_s: float  # before the first read: fingerprints, live room, threads (0.02 s measured)
    pin_byte_s: float  # pinning the ring while the first copy waits (0.04 s for 256 MiB)


FIXED = Fixed("built-in (H200 host, docs/benchmarks.md)", 1 / 55.4e9, 1 / 1.8e9, 1e-9, 0.02, 0.04 / (256 << 20))


def _reads(plan: Plan, c) -> tuple[float, int, int]:
    """(warm read seconds, requests, bytes read) of every run."""
    secs, n, nbytes = 0.0, 0, 0
    parts = plan.parts
    for r in plan.runs:
        ring = 0
        for q in r.requests:
            n += 1
            ring += q.read_bytes
            if q.strided:
                secs += pages_touched(q.length, q.stride, q.count) * c.page_s + q.read_bytes * c.copy_byte_s
            else:
                secs += q.length * c.read_byte_s + c.request_s
        host_in = max(0, r.read_bytes - ring)
        host_out = sum(parts[h.part].out_bytes for h in r.host_parts)
        host_reads = sum(parts[h.part].reads for h in r.host_parts)
        secs += host_in * c.read_byte_s + host_reads * c.request_s + host_out * FIXED.host_byte_s
        n += host_reads
        nbytes += r.read_bytes
    return secs, n, nbytes


def predict(plan: Plan, fixed: Fixed = FIXED) -> dict:
    """The predicted wall seconds of `plan`'s load (JSON-ready): warm and cold, their terms, the sources."""
    c = plan.costs or DEFAULTS
    warm_read, requests, read_bytes = _reads(plan, c)
    cold_read = read_bytes * fixed.disk_byte_s + requests * c.request_s
    link = plan.totals.payload_bytes * fixed.link_byte_s
    start = fixed.start_s + plan.layout.ring_bytes * fixed.pin_byte_s
    runs = max(1, len(plan.runs))

    def wall(read: float) -> float:
        return start + max(read, link) + min(read, link) / runs

    default = c.source == "default"
    return {
        "warm_seconds": wall(warm_read),
        "cold_seconds": wall(cold_read),
        "terms": {"fixed_seconds": start, "read_warm_seconds": warm_read, "read_cold_seconds": cold_read,
                  "link_seconds": link, "runs": runs},
        "figures": {"read": c.source, "link_disk_fixed": fixed.source},
        "default_costs": default,
        "note": ("compiled with default costs (run planc probe on the loading host, then compile again)" if default
                 else f"read costs measured by planc probe ({c.source})"),
    }


def beside(plan: Plan, wall: float | None) -> dict:
    """The prediction to put beside a load's measured `wall` (the report's `predicted`): warm and
    cold seconds, measured / predicted warm, and where the figures came from."""
    p = predict(plan)
    return {"wall_warm_seconds": p["warm_seconds"], "wall_cold_seconds": p["cold_seconds"],
            "measured_over_warm": (wall / p["warm_seconds"]) if wall and p["warm_seconds"] > 0 else None,
            "figures": p["figures"], "default_costs": p["default_costs"]}
