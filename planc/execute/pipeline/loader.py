"""The load pipeline: plan runs -> reads into pinned slots -> async copies -> kernels.

Threads: a pool of `io.workers` readers fills slots with `preadv`; the calling thread issues the
copies on the load's stream, a run's requests as their reads finish, in any order, and runs in
plan order; a run's kernels go on a stream of their own behind an event recorded after its copies
(`kernelruns.KernelRuns`), so they run while the next runs' copies go on. A run's first copy waits
for the kernels that last read its landing region, and an in-place conversion runs only after its
bytes arrived. A read is sent on once it is done if its run is the oldest with reads in flight, or
if its run touches no landing region (`unordered`: copies into the arena only, kernels that read
only the arena, no host parts), so that a slow read at a run's end holds up no slot of the next. A
slot is refilled only after the event recorded after its copies has completed (fence and swap),
waited for by the calling thread before it hands the slot to a reader. (Having the reader wait for
it instead, as `bench/refpipe.py` does, measured 0.97x: docs/benchmarks.md.)

`Pipeline` is this loop, composed of the parts it is given (`execute` builds them, in one place):
the load's regions (`allocation.Regions`: arena, landing, staging, the pinned ring), the reader
(`reader.Reader`), the pool its reads are submitted to, the kernel runs (`kernelruns.KernelRuns`),
the host path (`hostpath.HostPath`), the live-room check (`memory.live_room`) and the observer of
its events (`events`). The device itself is reached only through the device object it is given.
"""

from __future__ import annotations

import time
from collections import deque

from ...plan.admission import dominant_step
from ...base.errors import AdmissionError, ExecuteError
from ...plan.records import Refusal
from ...base.units import gib
from ..kernels import dispatch
from .events import CopyIssued, ReadDone, RunDone, RunStarted, RunWaited, Step, Timed
from .kernelruns import reads_landing
from ...base.codes import Code


def unordered(r) -> bool:
    """Whether run r's reads may be sent on before an earlier run's are: it lands nothing in a landing
    region or the staging area (every copy into the arena), its kernels read only the arena, and it
    has no host parts. Its copies then write only its own tensors' arena bytes, which no other run's
    copy or kernel touches, and its kernels still follow its copies (`KernelRuns`)."""
    return (not r.host_parts and not reads_landing(r)
            and all(not q.scatter and all(c.space == "arena" for c in q.copies) for q in r.requests))


class Pipeline:
    """One load's loop over the plan's runs (`run`), composed of the parts it is given."""

    def __init__(self, plan, *, dev, stream, regions, reader, submit, kernels, host, live_room, observer):
        self.plan, self.dev, self.stream = plan, dev, stream
        self.regions, self.reader, self.submit = regions, reader, submit
        self.kernels, self.host, self.live_room, self.observer = kernels, host, live_room, observer
        self.slot = plan.io.slot_bytes
        self.free_slots: deque = deque(range(plan.layout.ring_bytes // self.slot))
        self.copying: deque = deque()  # (slot, event)
        self.pending: deque = deque()  # (run, request index, request, slot, future)
        self.remaining = [len(r.requests) for r in plan.runs]
        self.unordered = [unordered(r) for r in plan.runs]
        self.guarded = -1  # the last run whose copies began (`KernelRuns.before_copies`)

    # -- the pipeline -----------------------------------------------------------------------
    def run(self) -> None:
        t_run = time.perf_counter()
        runs = self.plan.runs
        for r in runs:
            self._admit_run(r)
            self.observer(RunStarted(r.index))
            for qi, req in enumerate(r.requests):
                slot = self._take_slot()
                fut = self.submit(self._read, r, qi, req, slot)
                self.pending.append((r, qi, req, slot, fut))
                self._complete_ready()
            if r.host_parts:
                self._drain()
                for h in r.host_parts:
                    self.host.run(r, h, self._acquire_slot, self._fence)
            if not r.requests:
                self._launch_kernels(r)
        self._drain()
        self.regions.ready()
        self.kernels.flush_deferred()
        t0 = time.perf_counter()
        self.stream.synchronize()
        self.kernels.synchronize()
        self.observer(Step("final_sync", start=t0))
        self.observer(Step("run", start=t_run))

    def _launch_kernels(self, r) -> None:
        self.kernels.launch(r)
        self.observer(RunDone(r.index))

    def _admit_run(self, r) -> None:
        self.kernels.flush_readers_of(r.landing_region)
        need = r.host_bytes
        if not need:
            return
        t0 = time.perf_counter()
        room = self.live_room(r.index)
        self.observer(Timed("admit", start=t0))
        if need <= room.room_bytes:
            return
        self.observer(RunWaited(r.index))
        self._drain()
        self.stream.synchronize()
        self.kernels.synchronize()
        room = self.live_room(r.index)
        if need <= room.room_bytes:
            return
        raise AdmissionError.of(Refusal(
            Code.LIVE_ROOM, r.index, dominant_step(self.plan, r.index)[0], need, room.room_bytes,
            f"refused at run {r.index}: it needs {need:,} bytes ({gib(need)}) of host memory for host-path "
            f"buffers, the live room is {room.room_bytes:,} bytes ({gib(room.room_bytes)}: {room.terms()}) "
            f"with nothing else in flight; {room.hint(need, 'free memory, or move the rule to on: device')}"))

    def _read(self, r, qi: int, req, slot: int) -> int:
        """On a reader's thread: request `qi` of run `r` into its ring slot."""
        t0 = time.perf_counter()
        ring = self.regions.ring
        if req.stride:
            n = self.reader.read_strided(req.file, req.offset, req.length, req.stride, req.count, ring[slot])
        else:
            n = self.reader.read_into(req.file, req.offset, req.length, ring[slot], req.needed)
        self.observer(ReadDone(r.index, qi, req.length * req.count if req.stride else req.length, bool(req.stride),
                               start=t0))
        return n

    def _slot(self, k: int) -> int:
        if self.regions.ring[k] is None:
            t0 = time.perf_counter()
            self.regions.pinner.wait(k)
            self.observer(Timed("wait_pin", start=t0))
        return k

    def _fence(self, slot: int) -> None:
        """Record the slot's event after its copies; the slot is refilled only once the event completes."""
        events = self.regions.events
        ev = events[slot]
        if ev is None:
            ev = events[slot] = self.dev.event()
        ev.record(self.stream)
        self.copying.append((slot, ev))

    def _take_slot(self) -> int:
        """A ring slot for a read. Once the reads that are done have their copies issued: a free slot;
        else the oldest whose copy is queued, once that copy is done; else, with reads in flight and
        no copy queued, after the next read is done."""
        while not self.free_slots:
            if self._complete_ready():
                continue
            if self.copying:
                slot, ev = self.copying.popleft()
                t0 = time.perf_counter()
                ev.synchronize()
                self.observer(Step("slot_wait", start=t0))
                self.free_slots.append(slot)
            elif self.pending:
                self._wait_read()
            else:
                raise ExecuteError("the ring has no slot to give and nothing in flight", code=Code.RING_STUCK)
        return self._slot(self.free_slots.popleft())

    def _acquire_slot(self) -> int:
        """A ring slot whose last copy is done (the host path's)."""
        return self._take_slot()

    def _sendable(self) -> list:
        """The pending requests that may be sent on once read: those of the oldest run with requests
        in flight, and those of any `unordered` run, in any order. Another later run's wait: it may
        land in the region its run shares with that run's neighbour, whose kernels have not been
        launched yet."""
        if not self.pending:
            return []
        run, free = self.pending[0][0].index, self.unordered
        return [e for e in self.pending if e[0].index == run or free[e[0].index]]

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
        self.observer(Timed("wait_reads", start=t0))
        self._complete_ready()

    def _complete(self, entry) -> None:
        r, qi, req, slot, fut = entry
        t0 = time.perf_counter()
        fut.result()  # re-raises the reader's typed error
        self.regions.ready()
        t1 = time.perf_counter()
        self.observer(Timed("wait_reads", start=t0, end=t1))
        # an unordered run writes nothing a kernel may still read: no wait for its landing region
        if self.guarded != r.index and not self.unordered[r.index]:
            self.guarded = r.index
            self.kernels.before_copies(r)
        g = self.regions
        buf = g.ring[slot]
        if req.scatter:
            needed = req.needed
            base = req.staging * self.slot
            self.dev.stage(buf, ((g.staging, base, 0, needed, 1, 0),), self.stream)
            first, last, longest = g.scatter_rows[(r.index, qi)]
            self.kernels.join_warmer()
            dispatch.scatter(g.staging[base:base + needed], g.arena, g.table, first, last, req.width,
                             self.stream, longest, dev=self.dev)
            moved = sum(c.nbytes for c in req.copies)
            copies, kernels = 1, 1
        else:
            arena, landing = g.arena, g.landing
            moved = self.dev.stage(buf, [(arena if space == "arena" else landing[r.landing_region], dst, slot_off, n,
                                          rows, pitch)
                                         for slot_off, space, dst, n, rows, pitch in req.copies], self.stream)
            copies, kernels = len(req.copies), 0
        t2 = time.perf_counter()
        self._fence(slot)
        self.observer(CopyIssued(r.index, qi, copies, moved, kernels, start=t1, end=t2))
        self.remaining[r.index] -= 1
        if self.remaining[r.index] == 0:
            self._launch_kernels(r)

    def _drain(self) -> None:
        while self.pending:
            if not self._complete_ready():
                self._wait_read()

    def close(self) -> None:
        """Forget what is in flight (after a failure, the pool shut down)."""
        self.copying.clear()
        self.pending.clear()
