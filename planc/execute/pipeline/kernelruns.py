"""A run's kernels: launched after the run's copies on a stream of their own (which waits for an
event recorded after those copies on the load's stream), or deferred while the kernels are still
being loaded; and the warmer that loads them while the first reads run. A run's kernels so run
while the next runs' copies go on; copies into a landing region wait for an event recorded after
the kernels that last read it (`before_copies`).

`KernelRuns` is a part of the pipeline: given the plan, the device, the stream, the load's regions,
the warmer (a thread, or None) and its observer (told of each run's kernels: `KernelsLaunched`;
of the wait for the warmer: `Timed("wait_warm")`).
"""

from __future__ import annotations

import time

import numpy as np

from ...plan.records import DEQUANTIZE_OPS
from ..kernels import dispatch
from .events import KernelsLaunched, Timed
from ..kernels.formats import FORMATS


class KernelRuns:
    """Launches each run's kernels on the kernels' stream (`launch`) behind the run's copies,
    deferring them while the warmer still loads the kernels (`flush_deferred` launches those
    deferred); `before_copies(r)` holds the load's stream until the kernels reading run r's landing
    region are done; `synchronize()` waits for every kernel launched."""

    def __init__(self, plan, dev, stream, regions, warmer, observer):
        self.plan, self.dev, self.stream, self.regions = plan, dev, stream, regions
        self.warmer = warmer
        self.observer = observer
        self.deferred: list = []  # runs whose kernels wait for the kernel warmer
        self.kstream = None  # the kernels' stream, made with the first launch
        self.after: dict = {}  # landing region -> event recorded after the last kernels that read it

    def flush_readers_of(self, region: int) -> None:
        """Launch the deferred kernels if any of them reads landing region `region`."""
        if any(d.landing_region == region and reads_landing(d) for d in self.deferred):
            self.flush_deferred()

    def before_copies(self, r) -> None:
        """Before run r's first copy: the kernels that read its landing region launched (deferred
        ones flushed) and the load's stream held until they are done."""
        region = r.landing_region
        self.flush_readers_of(region)
        ev = self.after.pop(region, None)
        if ev is not None:
            ev.wait(self.stream)

    def synchronize(self) -> None:
        """Wait for every kernel launched (the load's stream is the caller's to wait for)."""
        if self.kstream is not None:
            self.kstream.synchronize()

    def join_warmer(self) -> None:
        """Wait for the kernel-warming thread before the first launch.

        Two threads loading the same kernel's module at once (the warmer and the first real launch)
        can load it twice; numba-cuda then finds the module handle already registered.
        """
        if self.warmer is not None:
            t0 = time.perf_counter()
            self.warmer.join()
            self.warmer = None
            self.observer(Timed("wait_warm", start=t0))

    def launch(self, r) -> None:
        """Launch run r's kernels, or defer them while the kernel warmer is still compiling.

        Deferred kernels are launched later on the same stream, so they still follow their run's
        copies; the arena ranges they touch are the run's own. A run that reuses a landing region
        flushes the deferred kernels first (`Pipeline._admit_run`), since they may still read it.
        """
        self.regions.ready()
        if r.kernels:
            if self.warmer is not None and self.warmer.is_alive():
                self.deferred.append(r)
                return
            self.flush_deferred()
        self._kernels_of(r)

    def flush_deferred(self) -> None:
        if self.deferred or self.warmer is not None:
            self.join_warmer()
        runs, self.deferred = self.deferred, []
        for r in runs:
            self._kernels_of(r)

    def _kernels_of(self, r) -> None:
        t0 = time.perf_counter()
        if not r.kernels:
            self.observer(KernelsLaunched(r.index, 0, len(r.parts) - len(r.host_parts), start=t0))
            return
        if self.kstream is None:
            self.kstream = self.dev.stream()
        copied = self.dev.event()  # after the run's copies (and everything before them) on the load's stream
        copied.record(self.stream)
        copied.wait(self.kstream)
        for k in r.kernels:
            self._kernel(r, k)
        if reads_landing(r):
            done = self.dev.event()
            done.record(self.kstream)
            self.after[r.landing_region] = done
        self.observer(KernelsLaunched(r.index, len(r.kernels), len(r.parts) - len(r.host_parts), start=t0))

    def _kernel(self, r, k) -> None:
        """Kernel record k of run r, launched by its format's class (`planc.execute.kernels.formats`)."""
        FORMATS[k.format].launch(self, r, k)


def reads_landing(r) -> bool:
    """Whether run r's kernels read its landing region (sources or FP8 scales placed there)."""
    return any(k.src_space != "arena" or k.op in DEQUANTIZE_OPS for k in r.kernels)


def warm_kernels(plan, dev):
    """Load the kernels the plan will launch, in a thread, while the first reads run.

    A kernel's first launch in a process loads its module (from the shipped machine code, a few
    milliseconds; compiled by numba where none fits, about half a second): done here on tiny arrays,
    that overlaps the I/O instead of stalling the stream (on a device that loads modules: not the
    simulator). `dev`: the load's device. Returns the thread, or None.
    """
    if not dev.loads_kernels:
        return None
    need = set()
    for r in plan.runs:
        for k in r.kernels:
            need.add((k.format, FORMATS[k.format].warm_key(plan, k)))
        for q in r.requests:
            if q.scatter:
                need.add(("scatter", (q.width,)))
    if plan.layout.zero:
        need.add(("zero", ()))
    if not need:
        return None
    import contextvars
    import threading

    # The thread selects the load's device itself, whatever a new thread would default to; the
    # caller's context (the load's settings) goes with it.
    t = threading.Thread(target=contextvars.copy_context().run, args=(_warm, dev, dev.current_device(),
                                                                       sorted(need, key=str)),
                         name="planc-warm", daemon=True)
    t.start()
    return t


def _warm(dev, idx: int, need) -> None:
    try:
        dev.select(idx)
        stream = dev.stream()
        buf = dev.device_bytes(256)  # a whole block of every GGUF type (Q6_K: 210 bytes)
        out = dev.device_bytes(1024)  # its 256 values in F32
        for fmt, key in need:
            if fmt == "scatter":
                table = dev.to_device(np.zeros((1, 3), np.int64))
                dispatch.scatter(buf, out, table, 0, 1, key[0], stream, 1, dev=dev)
            elif fmt == "zero":
                dispatch.zero(out, [(0, 1)], stream, dev=dev)
            else:
                FORMATS[fmt].warm(dev, key, buf, out, stream)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - warming is an optimization; the real launch reports errors
        pass
