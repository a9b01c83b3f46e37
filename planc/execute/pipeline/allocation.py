"""The regions of a load, as a value: what `Regions.start` allocates, what `free` gives back.

The reads need only the pinned ring, so they start at once; the device memory (one arena the size
of the model, landing regions where a kernel reads from one, device staging slots where a request
is scattered) is allocated by a thread of its own meanwhile and waited for before the first copy
(`ready`). Nothing the plan did not count is allocated, and `free` releases everything, also after
a failure. Also here: the default reader and pool of a load (`open_reader`, `open_pool`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ..kernels import dispatch
from .events import DeviceReady, Step, ignore
from ..io import readers
from ..io.reader import Reader
from ..io.readers import KEPT_READERS
from ..io.ring import KEPT, Background, Pinner, Slots
from ..device.seam import release, release_later


def open_reader(plan, cls=Reader) -> Reader:
    """The load's reader (a `cls`), every checkpoint file opened (before the ring's lanes start: see
    `Regions`)."""
    io = plan.io
    reader = cls(plan.checkpoint.root, io.direct, map_window=io.map_window_bytes, map_lanes=io.map_lanes)
    try:
        for f in plan.checkpoint.files:
            reader.open(f.path, f.size_bytes)
    except BaseException:
        reader.close()
        raise
    return reader


def open_pool(plan) -> ThreadPoolExecutor:
    """The readers' threads: `io.workers` of them, started now, or those kept from an earlier load
    (`io.readers.KEPT_READERS`: while the ring is kept)."""
    kept = KEPT_READERS.take(plan.io.workers)
    if kept is not None:
        return kept
    return readers.start(plan.io.workers, sum(len(r.requests) for r in plan.runs))


class Regions:
    """The memory of one load: the device arena, landing regions, staging and scatter table (made
    on a thread of their own), and the pinned ring (pinned in order by lanes of their own).

    `start` begins the device allocations; `pin_ring` starts the ring's lanes. The ring's lanes
    start last: populating a slot holds the process's memory-map lock for as long as the kernel
    takes to make its pages, and mapping a file (the page-cache check of each checkpoint file) or
    starting a thread (its stack) must wait for that lock: started after the lanes, the caller's own
    steps took tens of milliseconds instead of one or two. So the files are opened, and the readers'
    threads started, before the first slot is populated.

    `observer` is told of the device allocations (`Step("device_alloc")`), of each slot pinned
    (`Step("pin")`) and of the wait for the device regions (`DeviceReady`: the scatter table's upload
    is a copy, the padding's zero-fill a kernel)."""

    def __init__(self, plan, dev, stream, observer=ignore):
        self.plan, self.dev, self.stream = plan, dev, stream
        self.observer = observer
        self.uploads = 0  # copies issued with the device regions (the scatter table)
        self.slot = plan.io.slot_bytes
        self.arena = self.landing = self.staging = self.table = None
        self.scatter_rows: dict = {}
        self.ring = self.ring_owner = None
        self.events: list | None = None
        self.pinner: Pinner | None = None
        self.keep_ring = False  # PLANC_RING=kept: a finished load's ring stays pinned for the next
        self.pinned: list = []  # slots taken pinned from `io.ring.KEPT` (at the load's admission)
        self.kept_bytes = 0  # of the ring, the bytes taken pinned from `KEPT`
        self.device_job: Background | None = Background(self._allocate_device, "planc-alloc", dev)

    @classmethod
    def start(cls, plan, dev, stream, observer=ignore) -> "Regions":
        return cls(plan, dev, stream, observer)

    def pin_ring(self) -> None:
        """Start pinning the ring's slots, in order: slot k's pinning overlaps the reads and copies
        already running in slots < k instead of stalling the thread that issues them. The slots the
        load took pinned from `io.ring.KEPT` (`pinned`) come first and are not pinned again; this
        load's ring is kept when it is done with the load's setting PLANC_RING=kept, or while `KEPT`
        keeps rings then (`planc.warm_up`, until `planc.release_ring`)."""
        from ...base.settings import ring

        n = self.plan.layout.ring_bytes // self.slot
        self.ring = Slots([None] * n)
        self.ring_owner = Slots([None] * n)
        self.events = [None] * n
        self.keep_ring = ring() == "kept"
        taken, self.pinned = self.pinned, []  # at most n: taken for this plan's ring
        self.kept_bytes = len(taken) * self.slot
        self.pinner = Pinner(self.ring, self.ring_owner, self.slot, self.dev,
                             on_pin=lambda t0: self.observer(Step("pin", start=t0)), pinned=taken)
        del taken

    def _allocate_device(self) -> None:
        t0 = time.perf_counter()
        self.arena = self.dev.device_bytes(self.plan.layout.arena_bytes)
        self._allocate_regions()
        self.observer(Step("device_alloc", start=t0))

    def _allocate_regions(self) -> None:
        """The landing regions and the staging area with its scatter table: everything but the arena."""
        lay, dev = self.plan.layout, self.dev
        # One allocation per landing region (even runs, odd runs): each starts aligned for any element
        # type, which a region placed right after the other (its size unrounded) would not be.
        self.landing = [dev.device_bytes(n) if n else None for n in lay.landing_region_bytes]
        if lay.staging_bytes:
            self.staging = dev.device_bytes(lay.staging_bytes)
            table, self.scatter_rows = dispatch.scatter_table(self.plan)
            self.table = dev.to_device(table)
            self.uploads += 1

    def ready(self) -> None:
        """Wait for the device allocations (once); zero-fill the padding before any copy lands."""
        job = self.device_job
        if job is None:
            return
        t0 = time.perf_counter()
        self.device_job = None
        job.wait()
        zero = self.plan.layout.zero
        kernels = dispatch.zero(self.arena, zero, self.stream, dev=self.dev) if zero else 0
        self.observer(DeviceReady(self.uploads, kernels, start=t0))

    def dst(self, space: str, r, off: int, n: int):
        if space == "arena":
            return self.arena[off:off + n]
        return self.landing[r.landing_region][off:off + n]

    def stop(self) -> None:
        """Stop the threads that fill the regions (the device allocations waited for, the pinning lanes
        stopped); what they made is still held."""
        if self.device_job is not None:
            try:
                self.device_job.wait()
            except BaseException:  # noqa: BLE001 - freeing: what was allocated is dropped below
                pass
            self.device_job = None
        if self.pinner is not None:
            self.pinner.stop()
            self.pinner = None

    def free(self, full: bool = True) -> None:
        """Give back everything but the arena (`take_arena`, `drop_arena`); `full=False`: a finished
        load, its ring unpinned off the caller's path."""
        self.stop()
        held = [self.ring, self.ring_owner, self.pinned]
        self.pinned = []
        if (self.keep_ring or KEPT.keeping) and not full and self.ring is not None:  # kept for the next load
            pairs = [(o, v) for o, v in zip(self.ring_owner, self.ring) if v is not None]
            keep_ring = self.keep_ring  # asked again under KEPT's lock: a release_ring since says no
            back = KEPT.give(self.dev, self.slot, pairs, lambda: keep_ring or KEPT.keeping)
            if back is not pairs:  # kept: what is left to unpin is what it did not keep
                held = [back]
            del pairs, back
        self.landing = self.ring = self.ring_owner = self.staging = self.table = self.events = None
        if not full:
            release_later(held)
        del held
        release(full, settle=full)

    def take_arena(self):
        """The arena, handed to the loaded model: these regions no longer hold it."""
        arena, self.arena = self.arena, None
        return arena

    def drop_arena(self) -> None:
        self.arena = None
        release()
