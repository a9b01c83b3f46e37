"""predict: Plan -> its load's predicted wall time, warm and cold page cache, with where each figure came from.

The load is a pipeline: readers fill ring slots while the copy stream empties them onto the device,
two runs in flight. Its wall is the fixed costs before the first read, plus the slower of the two
streams, plus the part of the faster that cannot overlap (about one run's share of it):

    wall = fixed + max(read, link) + min(read, link) / runs
    fixed = start_s + ring_bytes * pin_byte_s     (the process's setup, then pinning the ring)
    read (warm) = for each request: whole, length * read_byte_s + request_s;
                  strided through a mapping, every page of its span faulted in on one of the
                  plan's mapping lanes: span pages * map_page_s / lanes + bytes * copy_byte_s
                  + host-path input bytes * read_byte_s + their output bytes * host_byte_s
    read (cold) = whole requests' bytes from disk at disk_byte_s; a mapped request's whole span at
                  map_cold_byte_s (its faults and their read-ahead bring the pages between its
                  segments too); + request_s per request
    link = payload bytes * link_byte_s

`predict_node` is the wall of several plans loading at once on one host (the ranks of a node): the
host's readers, cores and disk are shared (reads add up; mapped pages are faulted on every lane of
every rank, as many at a time as the host has cores, and their copies run node_copy_speedup times
one rank's rate; the disk reads the union of their byte ranges once), and each device's link
carries the payload of the plans on it.

The mapped-read figures are fitted to tensor-parallel ranks of a Llama-3-8B-shaped checkpoint on
the H200 host (docs/tp.md, "Predicted against measured"): the plan's `page_s` (`planc probe`'s) is
fitted to the pages that hold segments, which is what chooses the read method; a load faults in
every page of each window (`reader.fault_in`), so its wall follows the span.

The read, disk and link figures are the plan's own (`plan.costs`: the `planc probe` file it was
compiled with, or the built-in `DEFAULTS`; the link is the probe's only where it had a GPU to copy
to, `link_figure`); the host-conversion and fixed figures are built in (`FIXED`, measured on an
H200 host, docs/benchmarks.md). The result says which figures came from where, and a plan compiled
with default costs says so.

`limits` puts the predicted (and a load's measured) GB/s beside the machine's limits the same
figures hold: the link, and the host's rate of reading the plan's bytes out of the page cache
(`read_byte_s` for whole requests, `copy_byte_s` for mapped segments), the lower the ceiling.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

from .costs import DEFAULTS, MAP_LANES, PAGE
from .records import Plan


class Fixed(NamedTuple):
    """Figures planc probe does not measure (yet): the H200 host of docs/benchmarks.md."""

    source: str
    link_byte_s: float  # pinned host -> device: 55.4 GB/s (where the plan's costs hold no probed link)
    host_byte_s: float  # a host-path conversion (numpy / ml_dtypes), per output byte: about 1 GB/s
    start_s: float  # before the first read: fingerprints, live room, threads (0.02 s measured)
    pin_byte_s: float  # pinning the ring while the first copy waits (0.04 s for 256 MiB)
    map_page_s: float = 2.64e-7  # one lane faulting in, mapping and unmapping one page of a window
    map_cold_byte_s: float = 1 / 1.2e9  # a mapped span read from disk by faults (read-ahead), cold: on
    # three H200 hosts whose O_DIRECT reads ran at 1.56-1.8 GB/s it held within 20 % (docs/tp.md), where
    # scaling it with the disk's rate did not
    node_copy_speedup: float = 2.0  # ranks at once: their mapped copies, on more lanes, go this much faster
    # than one rank's (fitted on two H200 hosts, docs/tp.md; the lanes alone would say 4x, the memory they
    # share says less)
    cores: int = 16  # lanes faulting pages at once, at most, across every plan on the host


FIXED = Fixed("built-in (H200 host, docs/benchmarks.md)", 1 / 55.4e9, 1e-9, 0.02, 0.04 / (256 << 20))


class _Reads(NamedTuple):
    plain_s: float  # whole requests and host-path parts, warm
    mapped_pages: int  # pages of mapped windows, every one faulted in
    mapped_copy_s: float  # the segments copied out of the windows
    requests: int
    plain_bytes: int  # bytes of whole requests and host-path inputs (what a cold load reads from disk)
    mapped_span_bytes: int  # bytes the mapped requests' spans cover
    lanes: int  # windows mapped at once (io.map_lanes, at most io.workers)
    mapped_bytes: int  # segment bytes the mapped requests copy out of the page cache


def _span(q) -> int:
    return (q.count - 1) * q.stride + q.length


# plan -> its `_Reads` at its own costs: a report's prediction asks three times for the same (frozen) plan
_READS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _reads(plan: Plan) -> _Reads:
    rd = _READS.get(plan)
    if rd is None:
        rd = _READS[plan] = _count_reads(plan, plan.costs or DEFAULTS)
    return rd


def _count_reads(plan: Plan, c) -> _Reads:
    plain_s = copy_s = 0.0
    n = pages = plain_bytes = span_bytes = mapped_bytes = 0
    parts = plan.parts
    for r in plan.runs:
        ring = 0
        for q in r.requests:
            n += 1
            ring += q.read_bytes
            if q.strided:
                pages += -(-_span(q) // PAGE) + 1
                span_bytes += _span(q)
                mapped_bytes += q.read_bytes
                copy_s += q.read_bytes * c.copy_byte_s
            else:
                plain_s += q.length * c.read_byte_s + c.request_s
                plain_bytes += q.length
        host_in = max(0, r.read_bytes - ring)
        host_out = sum(parts[h.part].out_bytes for h in r.host_parts)
        host_reads = sum(parts[h.part].reads for h in r.host_parts)
        plain_s += host_in * c.read_byte_s + host_reads * c.request_s + host_out * FIXED.host_byte_s
        plain_bytes += host_in
        n += host_reads
    lanes = max(1, min(plan.io.map_lanes or MAP_LANES, plan.io.workers or 1))
    return _Reads(plain_s, pages, copy_s, n, plain_bytes, span_bytes, lanes, mapped_bytes)


def _warm(rd: _Reads, fixed: Fixed, lanes: int, c, copy_speedup: float = 1.0) -> float:
    # map_page_s was fitted on the host whose page_s is the built-in one: a probed host's mapped pages
    # cost in proportion to its own page_s
    page = fixed.map_page_s * (c.page_s / DEFAULTS.page_s if DEFAULTS.page_s > 0 else 1.0)
    return rd.plain_s + rd.mapped_copy_s / copy_speedup + rd.mapped_pages * page / max(1, min(lanes, fixed.cores))


def _cold(rd: _Reads, c, fixed: Fixed) -> float:
    return rd.plain_bytes * c.disk_byte_s + rd.mapped_span_bytes * fixed.map_cold_byte_s + rd.requests * c.request_s


def _wall(start: float, read: float, link: float, runs: int) -> float:
    return start + max(read, link) + min(read, link) / max(1, runs)


def link_figure(c, fixed: Fixed = FIXED) -> tuple[float, str]:
    """(seconds per byte, "probe" or "built-in") of the pinned host -> device link for a plan of
    costs `c`: the probe's, where the probe that `c` came from copied to a GPU, else `fixed`'s."""
    if c.source != "default" and c.link_byte_s != DEFAULTS.link_byte_s:
        return c.link_byte_s, "probe"
    return fixed.link_byte_s, "built-in"


def predict(plan: Plan, fixed: Fixed = FIXED) -> dict:
    """The predicted wall seconds of `plan`'s load (JSON-ready): warm and cold, their terms, the sources."""
    c = plan.costs or DEFAULTS
    rd = _reads(plan)
    warm_read, cold_read = _warm(rd, fixed, rd.lanes, c), _cold(rd, c, fixed)
    link_s, link_from = link_figure(c, fixed)
    link = plan.totals.payload_bytes * link_s
    start = fixed.start_s + plan.layout.ring_bytes * fixed.pin_byte_s
    runs = max(1, len(plan.runs))
    default = c.source == "default"
    return {
        "warm_seconds": _wall(start, warm_read, link, runs),
        "cold_seconds": _wall(start, cold_read, link, runs),
        "terms": {"fixed_seconds": start, "read_warm_seconds": warm_read, "read_cold_seconds": cold_read,
                  "link_seconds": link, "runs": runs, "mapped_pages": rd.mapped_pages,
                  "mapped_span_bytes": rd.mapped_span_bytes},
        "figures": {"read": c.source, "disk": c.source if c.disk_byte_s != DEFAULTS.disk_byte_s else "default",
                    "link": c.source if link_from == "probe" else "default", "link_disk_fixed": fixed.source},
        "default_costs": default,
        "note": ("compiled with default costs (run planc probe on the loading host, then compile again)" if default
                 else f"read costs measured by planc probe ({c.source})"),
    }


def _union(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for lo, hi in sorted(ranges):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def _disk_ranges(plan: Plan) -> tuple[dict, dict]:
    """Per file, the byte ranges a cold load reads from disk: (whole requests, mapped spans)."""
    plain: dict = {}
    mapped: dict = {}
    for r in plan.runs:
        for q in r.requests:
            (mapped if q.strided else plain).setdefault(q.file, []).append((q.offset, q.offset + (_span(q) if q.strided else q.length)))
    return plain, mapped


def predict_node(plans: list[Plan], devices: list[str] | None = None, fixed: Fixed = FIXED) -> dict:
    """The predicted wall of `plans` loading at once on one host (JSON-ready): warm and cold.
    `devices[i]` is plan i's device (None: each plan on a device of its own, as tensor-parallel
    ranks are); plans on one device share its link."""
    if not plans:
        return {"warm_seconds": 0.0, "cold_seconds": 0.0, "plans": 0}
    reads = [_reads(p) for p in plans]
    lanes = sum(rd.lanes for rd in reads)
    # copy_byte_s is one plan's copies on its own lanes (the probe's 4); more plans copy on more lanes
    speedups = [max(1.0, min(fixed.node_copy_speedup, min(lanes, fixed.cores) / rd.lanes)) for rd in reads]
    warm = sum(_warm(rd, fixed, lanes, p.costs or DEFAULTS, k) for rd, p, k in zip(reads, plans, speedups))
    devices = devices or [f"own-{i}" for i in range(len(plans))]
    per_device: dict = {}
    for p, d in zip(plans, devices):
        per_device[d] = per_device.get(d, 0) + p.totals.payload_bytes
    link = max(per_device.values()) * link_figure(plans[0].costs or DEFAULTS, fixed)[0]
    plain: dict = {}
    mapped: dict = {}
    for p in plans:
        a, b = _disk_ranges(p)
        for f, rs in a.items():
            plain.setdefault(f, []).extend(rs)
        for f, rs in b.items():
            mapped.setdefault(f, []).extend(rs)
    c = plans[0].costs or DEFAULTS
    cold = (sum(_union(rs) for rs in plain.values()) * c.disk_byte_s
            + sum(_union(rs) for rs in mapped.values()) * fixed.map_cold_byte_s
            + max(rd.requests for rd in reads) * c.request_s)
    start = max(fixed.start_s + p.layout.ring_bytes * fixed.pin_byte_s for p in plans)
    runs = max(max(1, len(p.runs)) for p in plans)
    return {"warm_seconds": _wall(start, warm, link, runs), "cold_seconds": _wall(start, cold, link, runs),
            "plans": len(plans), "devices": len(per_device),
            "terms": {"fixed_seconds": start, "read_warm_seconds": warm, "read_cold_seconds": cold,
                      "link_seconds": link, "lanes": lanes}}


def beside(plan: Plan, wall: float | None) -> dict:
    """The prediction to put beside a load's measured `wall` (the report's `predicted`): warm and
    cold seconds, measured / predicted warm, and where the figures came from."""
    p = predict(plan)
    return {"wall_warm_seconds": p["warm_seconds"], "wall_cold_seconds": p["cold_seconds"],
            "measured_over_warm": (wall / p["warm_seconds"]) if wall and p["warm_seconds"] > 0 else None,
            "figures": p["figures"], "default_costs": p["default_costs"]}


def _gbps(nbytes: float, seconds: float | None) -> float | None:
    """`nbytes` per `seconds` in GB/s; None where there is no rate (no time, or not finite)."""
    if not seconds or not math.isfinite(seconds) or seconds <= 0:
        return None
    rate = nbytes / seconds / 1e9
    return rate if math.isfinite(rate) else None  # a figure of a few seconds per 1e300 bytes: no rate


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def limits(plan: Plan, wall: float | None = None, fixed: Fixed = FIXED) -> dict:
    """The plan's predicted GB/s (and, given a load's measured `wall`, the measured GB/s) beside
    the limits its figures hold (JSON-ready; the report's and `explain`'s `limits`):
    - the link: payload bytes at `link_figure`'s rate (`planc probe`'s where it copied to a GPU, else
      built in);
    - the host: the bytes the plan reads out of the page cache, whole requests and host-path
      inputs at the plan's `read_byte_s`, mapped segments at its `copy_byte_s` (`planc probe`'s
      when it was compiled with them, else the defaults);
    the ceiling is the lower of the two. A rate that is absent or zero is None, and so is every
    fraction of it."""
    c = plan.costs or DEFAULTS
    rd = _reads(plan)
    payload = plan.totals.payload_bytes
    host_bytes = rd.plain_bytes + rd.mapped_bytes
    link_s, link_from = link_figure(c, fixed)
    link = _gbps(1, link_s)
    host = _gbps(host_bytes, rd.plain_bytes * c.read_byte_s + rd.mapped_bytes * c.copy_byte_s)
    named = [(r, k) for r, k in ((link, "link"), (host, "host")) if r is not None]
    ceiling, which = min(named) if named else (None, None)
    predicted = _gbps(payload, predict(plan, fixed)["warm_seconds"])
    probed = c.source != "default"
    doc = {"predicted_gb_per_s": predicted, "link_gb_per_s": link, "link_from": link_from,
           "host_gb_per_s": host, "host_from": "probe" if probed else "default",
           "probe_file": c.source if probed else None, "ceiling": which, "ceiling_gb_per_s": ceiling,
           "predicted_over_ceiling": _over(predicted, ceiling)}
    if wall is None:
        return doc
    measured = _gbps(payload, wall)
    return {**doc, "measured_gb_per_s": measured, "measured_over_link": _over(measured, link),
            "measured_over_host": _over(measured, host), "measured_over_ceiling": _over(measured, ceiling)}
