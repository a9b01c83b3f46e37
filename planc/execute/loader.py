"""The load pipeline: plan runs -> reads into pinned slots -> async copies -> kernels.

Threads: a pool of `io.workers` readers fills slots with `preadv`; the calling thread issues the
copies and kernels on one stream, in plan order. Because copies and kernels share the stream,
a landing region is reused only after the kernels that read it, and an in-place conversion runs
only after its bytes arrived. A slot is refilled only after the event recorded after its copies
has completed (fence and swap).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import AdmissionError, ExecuteError
from ..units import gib
from . import dispatch, seam
from .seam import pinned_ring, release
from .memory import live_room
from .reader import Reader
from .refconv import convert_host, dequantize_fp8_host, transpose_host


class _Slots(list):
    """The ring's slots (a list that can be weakly referenced, so tests can watch it go)."""


class Loader:
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
        self.pinner: _Pinner | None = None
        self.device_job: _Background | None = None
        self.deferred: list = []  # runs whose kernels wait for the kernel warmer
        self.free_slots: deque = deque()
        self.copying: deque = deque()  # (slot, event)
        self.pending: deque = deque()  # (run, request index, request, slot, future)
        self.arena = self.landing = self.ring_owner = self.ring = None
        self.reader: Reader | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.events: list = []
        self.dev = seam.device()

    # -- allocation -------------------------------------------------------------------------
    def allocate(self) -> None:
        """Start everything the load needs; the device allocations are made by a thread of their own.

        The reads need only the pinned ring, so they start at once; the arena (one allocation the size
        of the model, tens of milliseconds to map) is allocated meanwhile and waited for before the
        first copy (`_device`).
        """
        t0 = time.perf_counter()
        if self.warmer is None:
            self.warmer = warm_kernels(self.plan)
        lay = self.plan.layout
        self.stream = self.dev.stream()
        self.device_job = _Background(self._allocate_device, "planc-alloc")
        # Ring slots are pinned one by one, in order, by a thread of their own: pinning costs time in
        # proportion to the bytes (about 1-2 GB/s here), so slot k's pinning overlaps the reads and
        # copies already running in slots < k instead of stalling the thread that issues them.
        self.ring = _Slots([None] * (lay.ring_bytes // self.slot))
        self.ring_owner = _Slots([None] * len(self.ring))
        self.events = [None] * len(self.ring)
        self.pinner = _Pinner(self.ring, self.ring_owner, self.slot)
        self.reader = Reader(self.plan.checkpoint.root, self.io.direct)
        for f in self.plan.checkpoint.files:
            self.reader.open(f.path, f.size_bytes)
        self.pool = ThreadPoolExecutor(max_workers=self.io.workers, thread_name_prefix="planc-read")
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
        self.landing = self.ring = self.ring_owner = self.staging = self.table = self.events = None
        release(full)

    def drop_arena(self) -> None:
        self.arena = None
        release()

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
                while self.pending and self.pending[0][4].done():
                    self._complete_oldest()
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
        if any(d.landing_region == region and _reads_landing(d) for d in self.deferred):
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
            if self.pending and (self.pending[0][4].done() or not self.copying):
                self._complete_oldest()
            elif self.copying:
                slot, ev = self.copying.popleft()
                t0 = time.perf_counter()
                ev.synchronize()
                self.timings["wait_slots"] += time.perf_counter() - t0
                self.free_slots.append(slot)
            else:
                raise ExecuteError("the ring has no slot to give and nothing in flight", code="ring-stuck")
        return self._slot(self.free_slots.popleft())

    def _complete_oldest(self) -> None:
        r, qi, req, slot, fut = self.pending.popleft()
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
            first, last = self.scatter_rows[(r.index, qi)]
            self._join_warmer()
            dispatch.scatter(self.staging[base:base + needed], self.arena, self.table, first, last, req.width,
                             self.stream)
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
            self._complete_oldest()

    def _dst(self, space: str, r, off: int, n: int):
        if space == "arena":
            return self.arena[off:off + n]
        return self.landing[r.landing_region][off:off + n]

    def _join_warmer(self) -> None:
        """Wait for the kernel-warming thread before the first launch.

        Two threads loading the same kernel's module at once (the warmer and the first real launch)
        can load it twice; numba-cuda then finds the module handle already registered.
        """
        if self.warmer is not None:
            t0 = time.perf_counter()
            self.warmer.join()
            self.warmer = None
            self.timings["wait_warm"] = time.perf_counter() - t0

    def _launch_kernels(self, r) -> None:
        """Launch run r's kernels, or defer them while the kernel warmer is still compiling.

        Deferred kernels are launched later on the same stream, so they still follow their run's
        copies; the arena ranges they touch are the run's own. A run that reuses a landing region
        flushes the deferred kernels first (`_admit_run`), since they may still read it.
        """
        self._device()
        if r.kernels:
            if self.warmer is not None and self.warmer.is_alive():
                self.deferred.append(r)
                return
            self._flush_deferred()
        self._kernels_of(r)

    def _flush_deferred(self) -> None:
        if self.deferred or self.warmer is not None:
            self._join_warmer()
        runs, self.deferred = self.deferred, []
        for r in runs:
            self._kernels_of(r)

    def _kernels_of(self, r) -> None:
        for k in r.kernels:
            self._kernel(r, k)
            self.counters["kernels"] += 1
        if self.progress:
            self.progress(0, len(r.parts) - len(r.host_parts))

    def _kernel(self, r, k) -> None:
        from ..dtypes import DTYPES

        s_size, d_size = DTYPES[k.src_dtype].bits // 8, DTYPES[k.dst_dtype].bits // 8
        numel = k.numel
        src = self._dst(k.src_space, r, k.src_offset, max(1, numel * max(1, s_size)))
        dst = self.arena[k.dst_offset:k.dst_offset + numel * d_size]
        if k.op == "convert":
            dispatch.convert(src, dst, k.src_dtype, k.dst_dtype, numel, stream=self.stream)
        elif k.op == "dequantize":
            rows, cols, b = k.rows, k.cols, k.block
            n_scale = -(-rows // b) * -(-cols // b)
            scale = self._dst("landing", r, k.scale_offset, n_scale * 4)
            dispatch.dequantize_fp8(src, scale, dst, k.src_dtype, k.dst_dtype, rows, cols, b, stream=self.stream)
        else:  # transpose (the codec admits no other op)
            dispatch.transpose2d(src, dst, k.rows, k.cols, s_size, stream=self.stream)

    def _host_part(self, h) -> None:
        self._device()
        p = self.plan.parts[h.part]
        bufs = []
        for inp in p.inputs:
            buf = np.empty(inp.nbytes, dtype=np.uint8)
            for off, n, rel in inp.segments():
                if n:
                    self.reader.read_plain(inp.file, off, buf[rel:rel + n])
                self.counters["requests"] += 1
            bufs.append(buf)
        out = _host_transform(p, bufs)
        del bufs
        off = 0
        while off < len(out):
            n = min(self.slot, len(out) - off)
            slot = self._acquire_slot()
            buf = self.ring[slot]
            buf[:n] = out[off:off + n]
            self.dev.stage(buf, ((self.arena, h.dst_offset + off, 0, n, 1, 0),), self.stream)
            self.counters["copies"] += 1
            self._fence(slot)
            off += n
        self.counters["host_parts"] += 1
        if self.progress:
            self.progress(p.out_bytes, 1)


def _reads_landing(r) -> bool:
    """Whether run r's kernels read its landing region (sources or FP8 scales placed there)."""
    return any(k.src_space != "arena" or k.op == "dequantize" for k in r.kernels)


class _Background:
    """Run `fn` on a thread of its own, on the caller's device (a new thread's current device is
    device 0); `wait()` returns or re-raises its error, which `on_error` also receives at once."""

    def __init__(self, fn, name: str, on_error=None):
        import threading

        self.fn, self.on_error = fn, on_error
        self.error: BaseException | None = None
        self.dev = None if seam.simulated() else seam.current_device()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.dev is not None:
                seam.select(f"cuda:{self.dev}")
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
            if self.on_error is not None:
                self.on_error(e)

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            e, self.error = self.error, None
            raise e


class _Pinner:
    """Pins the ring's slots in order on a thread of its own; `wait(k)` returns once slot k is pinned.

    The thread stops between slots when asked; an error while pinning is raised by the next `wait`.
    """

    def __init__(self, ring: list, owners: list, nbytes: int):
        import threading

        self.ring, self.owners, self.nbytes = ring, owners, nbytes
        self.cond = threading.Condition()
        self.done = 0
        self.error: BaseException | None = None
        self.stopping = False
        self.job = _Background(self._pin, "planc-pin", on_error=self._failed)

    def _pin(self) -> None:
        for k in range(len(self.ring)):
            if self.stopping:
                return
            owner, view = pinned_ring(self.nbytes)
            with self.cond:
                if self.stopping:
                    return
                self.owners[k], self.ring[k] = owner, view
                self.done = k + 1
                self.cond.notify_all()

    def _failed(self, e: BaseException) -> None:
        with self.cond:
            self.error = e
            self.cond.notify_all()

    def wait(self, k: int) -> None:
        with self.cond:
            while self.done <= k and self.error is None:
                self.cond.wait()
            if self.done <= k:
                raise self.error

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
        self.job.thread.join()


def _host_transform(p, bufs: list) -> np.ndarray:
    w = p.inputs[0]
    if p.op == "convert":
        return convert_host(bufs[0], w.dtype, p.out_dtype)
    if p.op == "dequantize":
        rows, cols = w.shape
        return dequantize_fp8_host(bufs[0], bufs[1], w.dtype, p.out_dtype, rows, cols, p.block)
    if p.op == "transpose":
        rows, cols = w.shape
        src = bufs[0] if w.dtype == p.out_dtype else convert_host(bufs[0], w.dtype, p.out_dtype)
        from ..dtypes import DTYPES

        return transpose_host(src, rows, cols, DTYPES[p.out_dtype].bits // 8)
    return bufs[0]


def warm_kernels(plan):
    """Load the kernels the plan will launch, in a thread, while the first reads run.

    A kernel's first launch in a process loads its module (from the shipped machine code, a few
    milliseconds; compiled by numba where none fits, about half a second): done here on tiny arrays,
    that overlaps the I/O instead of stalling the stream. Returns the thread.
    """
    if seam.simulated():
        return None
    need = set()
    for r in plan.runs:
        for k in r.kernels:
            need.add((k.op, k.src_dtype, k.dst_dtype))
        for q in r.requests:
            if q.scatter:
                need.add(("scatter", q.width, None))
    if plan.layout.zero:
        need.add(("zero", None, None))
    if not need:
        return None
    import threading

    # A new thread's current device is device 0: the thread must use the load's device.
    t = threading.Thread(target=_warm, args=(seam.current_device(), sorted(need, key=str)), name="planc-warm",
                         daemon=True)
    t.start()
    return t


def _warm(idx: int, need) -> None:
    from ..dtypes import DTYPES

    try:
        dev = seam.device()
        dev.select(idx)
        stream = dev.stream()
        buf = dev.device_bytes(64)
        out = dev.device_bytes(64)
        for op, a, b in need:
            if op == "convert":
                dispatch.convert(buf, out if DTYPES[a].bits != DTYPES[b].bits else buf, a, b, 1, stream=stream)
            elif op == "dequantize":
                dispatch.dequantize_fp8(buf[:8], buf[8:16], out, a, b, 1, 1, 128, stream=stream)
            elif op == "transpose":
                dispatch.transpose2d(buf, out, 1, 1, DTYPES[a].bits // 8, stream=stream)
            elif op == "scatter":
                table = dev.to_device(np.zeros((1, 3), np.int64))
                dispatch.scatter(buf, out, table, 0, 1, a, stream)
            elif op == "zero":
                dispatch.zero(out, [(0, 1)], stream)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - warming is an optimization; the real launch reports errors
        pass
