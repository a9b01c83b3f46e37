"""The measured report of one load, as typed, immutable records built once (`Report.build`).

The report is built from the load's `meter.Meter` (its counts and timings, folded from its events),
its measured memory (`LoadMemory`), its reader (bytes read, how each file was read) and the plan's
prediction beside the measured wall (`Prediction`). Every field is a typed record where its shape is
fixed; a mapping only where the keys are data (`files`: path -> `FileRead`; `timings`: phase ->
seconds). planc reads it by attribute (`report.host.growth_bytes`); each record still reads like the
JSON it stands for (`report["host"]["growth_bytes"]`, `"verify" in report`) for callers that do, and
`as_json()` is the documented `planc run --json` contract (docs/cli.md, "run --json report";
tests/test_report_schema.py holds the two together). A later step that adds figures (the API's
compile time, the torch hand-off's) makes a new report (`with_timings`), never edits one.
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
    """A frozen dataclass that reads as the mapping of its JSON (its optional fields left out when None).

    A record made with `eq=False` (one that stands where the report had a plain mapping) also
    compares equal to that mapping."""

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

    def __hash__(self):  # a record that compares as the mapping it reads as (`eq=False`) hashes as one
        return hash(tuple(self.items()))

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
    kept_ring_bytes: int = 0


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
    link_from: str  # "probe" (planc probe copied to a GPU) or "built-in"
    host_gb_per_s: float | None
    host_from: str  # "probe" or "default"
    probe_file: str | None
    ceiling: str | None  # "link" or "host", the lower
    ceiling_gb_per_s: float | None
    predicted_over_ceiling: float | None
    measured_over_link: float | None
    measured_over_host: float | None
    measured_over_ceiling: float | None


@dataclass(frozen=True, eq=False)
class Parallel(Record):
    """The plan's tensor-parallel rank and world size."""
    rank: int
    size: int


@dataclass(frozen=True, eq=False)
class FileRead(Record):
    """How one checkpoint file was read: O_DIRECT or not, and why (`reader.Reader.modes`)."""
    direct: bool
    why: str


@dataclass(frozen=True, eq=False)
class KernelCode(Record):
    """Where this load's kernels came from (`planc.execute.device.launch.since`)."""
    kernels_from_shipped_cubin: int
    kernels_from_ptx: int
    kernels_from_cubin: int
    kernels_compiled: int
    fallbacks: tuple  # why each compiled launch had no shipped PTX


@dataclass(frozen=True, eq=False)
class Figures(Record):
    """Where the prediction's figures came from (`planc.plan.predict.predict`)."""
    read: str
    disk: str
    link: str  # the probe file, or "default"
    link_disk_fixed: str


@dataclass(frozen=True, eq=False)
class Predicted(Record):
    """The plan's predicted wall beside the measured one (`planc.plan.predict.beside`)."""
    wall_warm_seconds: float
    wall_cold_seconds: float
    measured_over_warm: float | None
    figures: Figures
    default_costs: bool


@dataclass(frozen=True, eq=False)
class Verified(Record):
    """`--verify`: the loaded bytes compared with the checkpoint's (`verify.verify_model`)."""
    ok: bool
    tensors: int
    parts: int
    bytes: int
    mismatches: tuple  # the first 50 parts that differ, sorted
    chunk_bytes: int
    predicted_host_bytes: int


@dataclass(frozen=True, eq=False)
class DigestCheck(Record):
    """The digest check (`planc.manifest.digestcheck.Verifier.summary`)."""
    ok: bool
    kind: str
    digest_file: str
    extent_bytes: int
    leaf_bytes: int
    extents: int
    hashed_bytes: int
    hasher: str
    simd: str | None
    loop_bytes: int
    fill_bytes: int
    verify_seconds: float


@dataclass(frozen=True)
class LoadMemory:
    """What `execute` measured of the host's and the device's memory around a load (not JSON)."""
    pinned_by: str  # how the ring was pinned (`Device.pin_method`)
    baseline_rss_bytes: int
    hwm_bytes: int
    hwm_reset: bool
    rss_after_bytes: int
    live_room_bytes: int  # at admission
    free_before: tuple | None  # the device's (free, total) bytes before the load; None: unknown
    free_alloc: tuple | None  # the same with the load's regions allocated
    kept_ring_bytes: int = 0  # of the ring, the bytes pinned before the baseline (`io.ring.KEPT`)


@dataclass(frozen=True)
class Prediction:
    """The plan's prediction beside a load's measured `wall` (not JSON: the report's `predicted` and
    `limits`)."""
    predicted: Predicted
    limits: Limits

    @classmethod
    def of(cls, plan, wall: float) -> "Prediction":
        from ...plan.predict import beside, limits

        b = beside(plan, wall)
        return cls(Predicted(**{**b, "figures": Figures(**b["figures"])}), Limits(**limits(plan, wall)))


@dataclass(frozen=True)
class Report(Record):
    """What one load did, next to what its plan predicted."""
    OPTIONAL = ("verify", "digest")

    simulator: bool
    device: str
    tensor_parallel: Parallel
    wall_seconds: float
    gb_per_s: float | None
    payload_bytes: int
    bytes_read: BytesRead
    requests: Count
    copies: Count
    kernels: Count
    run_waits: int
    timings: Mapping  # phase -> seconds (docs/cli.md): the phases are data (the API adds its own)
    host: HostMemory
    device_memory: DeviceMemory
    files: Mapping  # checkpoint file -> FileRead
    retries: int
    kernel_code: KernelCode
    predicted: Predicted
    limits: Limits
    verify: Verified | None = None
    digest: DigestCheck | None = None

    def with_timings(self, **seconds: float) -> "Report":
        """This report with more phases timed (rounded to the microsecond)."""
        return dataclasses.replace(self, timings={**self.timings, **{k: round(v, 6) for k, v in seconds.items()}})

    @classmethod
    def build(cls, plan, meter, memory: LoadMemory, reads, prediction: Prediction, *, device: str,
              simulator: bool, wall: float, kernel_code: Mapping, verify: Mapping | None = None,
              digest: Mapping | None = None) -> "Report":
        """The report of a load of `plan`: its counts and timings from `meter` (`meter.Meter`), its
        memory, its reader `reads` (None: no reader), the plan's `prediction` beside its `wall`, on
        `device`; `kernel_code`: `launch.since`'s counts; `verify` / `digest`: the checks' summaries
        (None: not checked)."""
        t, lay, n = plan.totals, plan.layout, meter.counts()
        payload = t.payload_bytes
        dev_used = None
        if memory.free_before is not None and memory.free_alloc is not None:
            dev_used = memory.free_before[0] - memory.free_alloc[0]
        return cls(
            predicted=prediction.predicted,
            limits=prediction.limits,
            simulator=simulator,
            device=device,
            tensor_parallel=Parallel(plan.tensor_parallel.rank, plan.tensor_parallel.size),
            wall_seconds=wall,
            gb_per_s=payload / wall / 1e9 if wall > 0 else None,
            payload_bytes=payload,
            bytes_read=BytesRead(t.read_bytes, reads.bytes_read if reads else None),
            requests=Count(t.requests, n.requests),
            copies=Count(t.copies, n.copies),
            kernels=Count(t.kernels, n.kernels),
            run_waits=n.run_waits,
            timings={k: round(v, 6) for k, v in meter.timings().items()},
            host=HostMemory(
                predicted_peak_bytes=plan.peak.host_bytes,
                pinned_bytes=lay.ring_bytes,
                pinned_by=memory.pinned_by,
                baseline_rss_bytes=memory.baseline_rss_bytes,
                hwm_bytes=memory.hwm_bytes,
                hwm_reset=memory.hwm_reset,
                # the kept ring is in the baseline already: counted in, as the ring pinned by the load is
                growth_bytes=memory.hwm_bytes - memory.baseline_rss_bytes + memory.kept_ring_bytes,
                live_room_bytes=memory.live_room_bytes,
                rss_after_bytes=memory.rss_after_bytes,
                kept_ring_bytes=memory.kept_ring_bytes,
            ),
            device_memory=DeviceMemory(
                predicted_peak_bytes=plan.peak.device_bytes,
                arena_bytes=lay.arena_bytes,
                landing_bytes=lay.landing_bytes,
                measured_allocated_bytes=dev_used,
                free_before_bytes=None if memory.free_before is None else memory.free_before[0],
            ),
            files={f: FileRead(**m) for f, m in reads.modes().items()} if reads else {},
            retries=reads.retries if reads else 0,
            kernel_code=KernelCode(**kernel_code),
            verify=None if verify is None else Verified(**verify),
            digest=None if digest is None else DigestCheck(**digest),
        )
