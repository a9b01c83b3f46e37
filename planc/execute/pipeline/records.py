"""The measured report of one load, as typed, immutable records built once (`build_report`).

Each record reads like the JSON it stands for (`report["host"]["growth_bytes"]`, `"verify" in
report`) and `as_json()` is the documented `planc run --json` contract (docs/cli.md, "run --json
report"; tests/test_report_schema.py holds the two together). A later step that adds figures
(the API's compile time, the torch hand-off's) makes a new report (`with_timings`), never edits one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields


class FrozenDict(dict):
    """A dict that refuses every change (JSON encodes it as the dict it is)."""

    def _refuse(self, *a, **k):
        raise TypeError("a load's report is immutable: make a new one (Report.with_timings)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _refuse

    def __hash__(self):
        return hash(tuple(sorted(self.items(), key=repr)))


def _frozen(v):
    """`v` with its mappings read-only and its lists tuples (deeply)."""
    if isinstance(v, Mapping) and not isinstance(v, Record):
        return FrozenDict({k: _frozen(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    return v


def _json(v):
    if isinstance(v, Record):
        return v.as_json()
    if isinstance(v, Mapping):
        return {k: _json(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    return v


class Record(Mapping):
    """A frozen dataclass that reads as the mapping of its JSON (its optional fields left out when None)."""

    OPTIONAL: tuple = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))

    def _keys(self):
        return [f.name for f in fields(self) if not (f.name in self.OPTIONAL and getattr(self, f.name) is None)]

    def __getitem__(self, key: str):
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def as_json(self) -> dict:
        """Plain JSON data (dicts, lists, numbers, strings, None)."""
        return {k: _json(getattr(self, k)) for k in self._keys()}


@dataclass(frozen=True, eq=True)
class Count(Record):
    """A count the plan predicted and the load issued."""
    predicted: int
    issued: int


@dataclass(frozen=True)
class BytesRead(Record):
    predicted: int
    measured: int | None


@dataclass(frozen=True)
class HostMemory(Record):
    predicted_peak_bytes: int
    pinned_bytes: int
    pinned_by: str
    baseline_rss_bytes: int
    hwm_bytes: int
    hwm_reset: bool
    growth_bytes: int
    live_room_bytes: int
    rss_after_bytes: int


@dataclass(frozen=True)
class DeviceMemory(Record):
    predicted_peak_bytes: int
    arena_bytes: int
    landing_bytes: int
    measured_allocated_bytes: int | None
    free_before_bytes: int | None


@dataclass(frozen=True)
class Limits(Record):
    """The load's GB/s (payload bytes per second / 1e9) beside the rates the plan's figures hold
    for the link and the host's reads (`planc.plan.predict.limits`); null where a rate is absent."""
    predicted_gb_per_s: float | None
    measured_gb_per_s: float | None
    link_gb_per_s: float | None
    link_from: str  # "built-in"
    host_gb_per_s: float | None
    host_from: str  # "probe" or "default"
    probe_file: str | None
    ceiling: str | None  # "link" or "host", the lower
    ceiling_gb_per_s: float | None
    predicted_over_ceiling: float | None
    measured_over_link: float | None
    measured_over_host: float | None
    measured_over_ceiling: float | None


@dataclass(frozen=True)
class Report(Record):
    """What one load did, next to what its plan predicted."""
    OPTIONAL = ("verify", "digest")

    simulator: bool
    device: str
    tensor_parallel: Mapping
    wall_seconds: float
    gb_per_s: float | None
    payload_bytes: int
    bytes_read: BytesRead
    requests: Count
    copies: Count
    kernels: Count
    run_waits: int
    timings: Mapping  # phase -> seconds (docs/cli.md)
    host: HostMemory
    device_memory: DeviceMemory
    files: Mapping  # file -> {direct, why}
    retries: int
    kernel_code: Mapping
    predicted: Mapping  # the plan's predicted wall beside the measured one (planc.plan.predict.beside)
    limits: Limits
    verify: Mapping | None = None
    digest: Mapping | None = None  # the digest check (`planc.manifest.digestcheck.Verifier.summary`)

    def with_timings(self, **seconds: float) -> "Report":
        """This report with more phases timed (rounded to the microsecond)."""
        return dataclasses.replace(self, timings={**self.timings, **{k: round(v, 6) for k, v in seconds.items()}})


def build_report(plan, *, device: str, simulator: bool, counters: Mapping, timings: Mapping, wall: float,
                 reader, pinned_by: str, base_rss: int, hwm: int, hwm_reset: bool, rss_after: int,
                 free_before, free_alloc, live_room_bytes: int, kernel_code: Mapping,
                 verify: Mapping | None, digest: Mapping | None = None) -> Report:
    t = plan.totals
    c = counters
    lay = plan.layout
    payload = t.payload_bytes
    dev_used = None
    if free_before is not None and free_alloc is not None:
        dev_used = free_before[0] - free_alloc[0]
    from ...plan.predict import beside, limits

    return Report(
        predicted=beside(plan, wall),
        limits=Limits(**limits(plan, wall)),
        simulator=simulator,
        device=device,
        tensor_parallel=plan.tensor_parallel._asdict(),
        wall_seconds=wall,
        gb_per_s=payload / wall / 1e9 if wall > 0 else None,
        payload_bytes=payload,
        bytes_read=BytesRead(t.read_bytes, reader.bytes_read if reader else None),
        requests=Count(t.requests, c["requests"]),
        copies=Count(t.copies, c["copies"]),
        kernels=Count(t.kernels, c["kernels"]),
        run_waits=c["run_waits"],
        timings={k: round(v, 6) for k, v in timings.items()},
        host=HostMemory(
            predicted_peak_bytes=plan.peak.host_bytes,
            pinned_bytes=lay.ring_bytes,
            pinned_by=pinned_by,
            baseline_rss_bytes=base_rss,
            hwm_bytes=hwm,
            hwm_reset=hwm_reset,
            growth_bytes=hwm - base_rss,
            live_room_bytes=live_room_bytes,
            rss_after_bytes=rss_after,
        ),
        device_memory=DeviceMemory(
            predicted_peak_bytes=plan.peak.device_bytes,
            arena_bytes=lay.arena_bytes,
            landing_bytes=lay.landing_bytes,
            measured_allocated_bytes=dev_used,
            free_before_bytes=None if free_before is None else free_before[0],
        ),
        files=reader.modes() if reader else {},
        retries=reader.retries if reader else 0,
        kernel_code=kernel_code,
        verify=verify,
        digest=digest,
    )
