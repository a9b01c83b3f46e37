"""The load pipeline: plan runs -> reads into pinned slots -> async copies -> kernels.

Threads: a pool of `io.workers` readers fills slots with `preadv`; the calling thread issues the
copies and kernels on one stream: a run's requests as their reads finish, in any order, and runs in
plan order. Because copies and kernels share the stream,
a landing region is reused only after the kernels that read it, and an in-place conversion runs
only after its bytes arrived. A slot is refilled only after the event recorded after its copies
has completed (fence and swap).

`Loader` is this pipeline; its other concerns live beside it, one module each: allocation and
release (`allocation.py`), the pinned ring and the background threads (`ring.py`), a run's kernels
and their warmer (`kernelruns.py`), the host path (`hostpath.py`). The device itself is reached
only through `seam.device()`.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ..errors import AdmissionError, ExecuteError
from ..units import gib
from . import dispatch, seam
from .allocation import Allocation
from .hostpath import HostPath
from .kernelruns import KernelRuns, reads_landing
from .memory import live_room
from .reader import Reader
from .ring import Background, Pinner


class Loader(Allocation, KernelRuns, HostPath):
    def __init__(self, plan, progress=None):
        self.plan = plan
        self.io = plan.io
        self.slot = self.io.slot_bytes
        self.progress = progress
        self.counters = {"requests": 0, "copies": 0, "kernels": 0, "host_parts": 0, "run_waits": 0}
        self.timings = {"allocate": 0.0, "wait_reads": 0.0, "wait_slots": 0.0, "wait_pin": 0.0, "issue": 0.0,
                        "admit": 0.0, "final_sync": 0.0}
        self.staging = self.table = self.stream = None
        self.warmer = None
        self.pinner: Pinner | None = None
        self.device_job: Background | None = None
        self.deferred: list = []  # runs whose kernels wait for the kernel warmer
        self.free_slots: deque = deque()
        self.copying: deque = deque()  # (slot, event)
        self.pending: deque = deque()  # (run, request index, request, slot, future)
        self.arena = self.landing = self.ring_owner = self.ring = None
        self.reader: Reader | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.events: list = []
        self.dev = seam.device()

    # -- the pipeline -----------------------------------------------------------------------
    def run(self) -> None:
        runs = self.plan.runs
        self.remaining = [len(r.requests) for r in runs]
        for r in runs:
            self._admit_run(r)
            for qi, req in enumerate(r.requests):
                slot = self._acquire_slot()
                fut = self.pool.submit(self._read, req, slot)
                self.pending.append((r, qi, req, slot, fut))
                self._complete_ready()
            if r.host_parts:
                self._drain()
                for h in r.host_parts:
                    self._host_part(h)
            if not r.requests:
                self._launch_kernels(r)
        self._drain()
        self._device()
        self._flush_deferred()
        t0 = time.perf_counter()
        self.stream.synchronize()
        self.timings["final_sync"] = time.perf_counter() - t0

    def _admit_run(self, r) -> None:
        region = r.landing_region
        if any(d.landing_region == region and reads_landing(d) for d in self.deferred):
            self._flush_deferred()
        need = r.host_bytes
        if not need:
            return
        t0 = time.perf_counter()
        room = live_room()
        self.timings["admit"] += time.perf_counter() - t0
        if need <= room["room_bytes"]:
            return
        self.counters["run_waits"] += 1
        self._drain()
        self.stream.synchronize()
        room = live_room()
        if need <= room["room_bytes"]:
            return
        raise AdmissionError(
            f"refused at run {r.index}: it needs {need:,} bytes ({gib(need)}) of host memory for host-path "
            f"buffers, the live room is {room['room_bytes']:,} bytes ({gib(room['room_bytes'])}: available "
            f"{room['available_bytes']}, cgroup room {room['cgroup_room_bytes']}, reserve {room['reserve_bytes']}) "
            f"with nothing else in flight; free memory, or move the rule to on: device",
            code="live-room", refusal={"run": r.index, "needed_bytes": need, "allowed_bytes": room["room_bytes"]})

    def _read(self, req, slot: int) -> int:
        if req.stride:
            return self.reader.read_strided(req.file, req.offset, req.length, req.stride, req.count, self.ring[slot])
        return self.reader.read_into(req.file, req.offset, req.length, self.ring[slot], req.needed)

    def _slot(self, k: int) -> int:
        if self.ring[k] is None:
            t0 = time.perf_counter()
            self.pinner.wait(k)
            self.timings["wait_pin"] += time.perf_counter() - t0
        return k

    def _fence(self, slot: int) -> None:
        """Record the slot's event after its copies; the slot is refilled only once the event completes."""
        ev = self.events[slot]
        if ev is None:
            ev = self.events[slot] = self.dev.event()
        ev.record(self.stream)
        self.copying.append((slot, ev))

    def _acquire_slot(self) -> int:
        while not self.free_slots:
            if self._complete_ready():
                continue
            if self.pending and not self.copying:
                self._wait_read()
            elif self.copying:
                slot, ev = self.copying.popleft()
                t0 = time.perf_counter()
                ev.synchronize()
                self.timings["wait_slots"] += time.perf_counter() - t0
                self.free_slots.append(slot)
            else:
                raise ExecuteError("the ring has no slot to give and nothing in flight", code="ring-stuck")
        return self._slot(self.free_slots.popleft())

    def _sendable(self) -> list:
        """The pending requests that may be sent on once read: those of the oldest run with requests
        in flight, in any order. A later run's wait: it may land in the region its run shares with
        that run's neighbour, whose kernels have not been launched yet."""
        if not self.pending:
            return []
        run = self.pending[0][0].index
        return [e for e in self.pending if e[0].index == run]

    def _ready(self) -> list:
        """The sendable requests whose reads are done."""
        return [e for e in self._sendable() if e[4].done()]

    def _complete_ready(self) -> bool:
        """Send on every read that is done and may go (`_ready`); whether there was one. A slow read
        (a strided one) no longer holds up the slots of the reads issued after it."""
        ready = self._ready()
        for e in ready:
            self.pending.remove(e)
            self._complete(e)
        return bool(ready)

    def _wait_read(self) -> None:
        """Wait until a read that may be sent on is done, and send on those that are."""
        from concurrent.futures import FIRST_COMPLETED, wait

        t0 = time.perf_counter()
        wait([e[4] for e in self._sendable()], return_when=FIRST_COMPLETED)
        self.timings["wait_reads"] += time.perf_counter() - t0
        self._complete_ready()

    def _complete(self, entry) -> None:
        r, qi, req, slot, fut = entry
        t0 = time.perf_counter()
        fut.result()  # re-raises the reader's typed error
        self._device()
        t1 = time.perf_counter()
        self.timings["wait_reads"] += t1 - t0
        self.counters["requests"] += 1
        buf = self.ring[slot]
        if req.scatter:
            needed = req.needed
            base = req.staging * self.slot
            self.dev.stage(buf, ((self.staging, base, 0, needed, 1, 0),), self.stream)
            first, last, longest = self.scatter_rows[(r.index, qi)]
            self._join_warmer()
            dispatch.scatter(self.staging[base:base + needed], self.arena, self.table, first, last, req.width,
                             self.stream, longest)
            self.counters["copies"] += 1
            self.counters["kernels"] += 1
            moved = sum(c.nbytes for c in req.copies)
        else:
            arena, landing = self.arena, self.landing
            moved = self.dev.stage(buf, [(arena if space == "arena" else landing[r.landing_region], dst, slot_off, n,
                                          rows, pitch)
                                         for slot_off, space, dst, n, rows, pitch in req.copies], self.stream)
            self.counters["copies"] += len(req.copies)
        self.timings["issue"] += time.perf_counter() - t1
        self._fence(slot)
        self.remaining[r.index] -= 1
        if self.remaining[r.index] == 0:
            self._launch_kernels(r)
        if self.progress:
            self.progress(moved)

    def _drain(self) -> None:
        while self.pending:
            if not self._complete_ready():
                self._wait_read()

    def _dst(self, space: str, r, off: int, n: int):
        if space == "arena":
            return self.arena[off:off + n]
        return self.landing[r.landing_region][off:off + n]
