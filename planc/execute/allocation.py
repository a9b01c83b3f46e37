"""Allocation for a load: what `Loader.allocate` starts, what `free` gives back.

The reads need only the pinned ring, so they start at once; the device memory (one arena the size
of the model, landing regions where a kernel reads from one, device staging slots where a request
is scattered) is allocated by a thread of its own meanwhile and waited for before the first copy.
Nothing the plan did not count is allocated, and `free` releases everything, also after a failure.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import dispatch
from .reader import Reader
from .ring import Background, Pinner, Slots
from .seam import release, release_later


def _start_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Have `pool` start `n` threads now (it otherwise starts one per submission, later)."""
    if n <= 0:
        return
    gate = threading.Barrier(n + 1, timeout=10)
    try:
        for _ in range(n):
            pool.submit(gate.wait)
        gate.wait()
    except threading.BrokenBarrierError:  # slow to start: the pool has the threads it has, and starts more
        pass                             # on demand
    except BaseException:  # a thread that cannot start, or Ctrl-C: no started thread may wait on
        gate.abort()       # the gate after the error has left (free() joins them)
        raise


class Allocation:
    """The allocation half of `Loader` (a mixin: the loader's state is one object)."""

    # -- allocation -------------------------------------------------------------------------
    def allocate(self) -> None:
        """Start everything the load needs; the device allocations are made by a thread of their own.

        The reads need only the pinned ring, so they start at once; the arena (one allocation the size
        of the model, tens of milliseconds to map) is allocated meanwhile and waited for before the
        first copy (`_device`).

        The ring's lanes start last. Populating a slot holds the process's memory-map lock for as long
        as the kernel takes to make its pages, and mapping a file (the page-cache check of each
        checkpoint file) or starting a thread (its stack) must wait for that lock: started after the
        lanes, the caller's own steps took tens of milliseconds instead of one or two. So the files
        are opened, and the readers' threads started, before the first slot is populated.
        """
        t0 = time.perf_counter()
        lay = self.plan.layout
        self.stream = self.dev.stream()
        self.device_job = Background(self._allocate_device, "planc-alloc")
        if self.warmer is None:
            from .kernelruns import warm_kernels

            self.warmer = warm_kernels(self.plan)
        self.reader = Reader(self.plan.checkpoint.root, self.io.direct, map_window=self.io.map_window_bytes,
                             map_lanes=self.io.map_lanes)
        for f in self.plan.checkpoint.files:
            self.reader.open(f.path, f.size_bytes)
        self.pool = ThreadPoolExecutor(max_workers=self.io.workers, thread_name_prefix="planc-read")
        _start_threads(self.pool, min(self.io.workers, sum(len(r.requests) for r in self.plan.runs)))
        # Ring slots are pinned in order by lanes of their own: pinning costs time in proportion to the
        # bytes, so slot k's pinning overlaps the reads and copies already running in slots < k instead
        # of stalling the thread that issues them.
        self.ring = Slots([None] * (lay.ring_bytes // self.slot))
        self.ring_owner = Slots([None] * len(self.ring))
        self.events = [None] * len(self.ring)
        self.pinner = Pinner(self.ring, self.ring_owner, self.slot)
        self.free_slots.extend(range(lay.ring_bytes // self.slot))
        self.timings["allocate"] = time.perf_counter() - t0

    def _allocate_device(self) -> None:
        lay, dev = self.plan.layout, self.dev
        self.arena = dev.device_bytes(lay.arena_bytes)
        # One allocation per landing region (even runs, odd runs): each starts aligned for any element
        # type, which a region placed right after the other (its size unrounded) would not be.
        self.landing = [dev.device_bytes(n) if n else None for n in lay.landing_region_bytes]
        if lay.staging_bytes:
            self.staging = dev.device_bytes(lay.staging_bytes)
            table, self.scatter_rows = dispatch.scatter_table(self.plan)
            self.table = dev.to_device(table)
            self.counters["copies"] += 1

    def _device(self) -> None:
        """Wait for the device allocations (once); zero-fill the padding before any copy lands."""
        job = self.device_job
        if job is None:
            return
        t0 = time.perf_counter()
        self.device_job = None
        job.wait()
        zero = self.plan.layout.zero
        if zero:
            self.counters["kernels"] += dispatch.zero(self.arena, zero, self.stream)
        self.timings["wait_device"] = time.perf_counter() - t0

    def free(self, full: bool = True) -> None:
        if self.device_job is not None:
            try:
                self.device_job.wait()
            except BaseException:  # noqa: BLE001 - freeing: what was allocated is dropped below
                pass
            self.device_job = None
        if self.pinner is not None:
            self.pinner.stop()
            self.pinner = None
        self._join_warmer()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        if self.reader is not None:
            self.reader.close()
        try:
            if self.stream is not None:
                self.stream.synchronize()
        except Exception:  # noqa: BLE001 - the device may already be in error; still drop what we hold
            pass
        self.copying.clear()
        self.pending.clear()
        held = [self.ring, self.ring_owner]
        self.landing = self.ring = self.ring_owner = self.staging = self.table = self.events = None
        if not full:  # a finished load: its ring is unpinned off the caller's path
            release_later(held)
        del held
        release(full, settle=full)

    def drop_arena(self) -> None:
        self.arena = None
        release()
