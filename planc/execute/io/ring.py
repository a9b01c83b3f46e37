"""The pinned ring and the loader's background threads.

`Slots` is the ring (a list that can be weakly referenced, so tests can watch it go); `Pinner`
pins its slots in order on a few threads of its own, so that slot k's pinning overlaps the reads
and copies already running in slots < k; `Background` runs a function on a thread of
its own, on the device it is given (at the index the caller's thread has selected there).
"""

from __future__ import annotations

import time

from ..device.seam import pinned_ring


class Slots(list):
    """The ring's slots (a list that can be weakly referenced, so tests can watch it go)."""


class Background:
    """Run `fn` on a thread of its own, on `dev` at the caller's index there (selected in the thread,
    whatever a new thread would default to); `wait()` returns or re-raises its error, which
    `on_error` also receives at once."""

    def __init__(self, fn, name: str, dev, on_error=None):
        import contextvars
        import threading

        self.fn, self.on_error = fn, on_error
        self.error: BaseException | None = None
        self.device = dev
        self.idx = self.device.current_device()
        # the caller's context goes with it: the load's settings (`settings.using`) hold in the thread
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), name=name,
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.device.select(self.idx)
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
            if self.on_error is not None:
                self.on_error(e)
        finally:
            # `fn` is often a bound method of the object that holds this job: dropped, no cycle keeps
            # that object (and what it holds: a ring, device memory) alive for the garbage collector
            self.fn = self.on_error = None

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            e, self.error = self.error, None
            raise e


class Pinner:
    """Pins the ring's slots on `lanes` threads of their own, each taking the next slot in order;
    `wait(k)` returns once slot k is pinned.

    Pinning is the kernel zeroing and mapping pages, which scales with threads; the driver's
    registration after it is short. The threads stop between slots when asked; an error while
    pinning is raised by the next `wait` of a slot not pinned.
    """

    LANES = 4

    def __init__(self, ring: list, owners: list, nbytes: int, dev, lanes: int | None = None, on_pin=None):
        import threading

        self.ring, self.owners, self.nbytes, self.dev = ring, owners, nbytes, dev
        self.on_pin = on_pin  # called with each slot's pinning start (`time.perf_counter()`), on its lane
        self.cond = threading.Condition()
        self.next = 0  # the next slot a lane takes
        self.error: BaseException | None = None
        self.stopping = False
        self.jobs: list[Background] = []
        try:
            for i in range(max(1, min(self.LANES if lanes is None else lanes, len(ring)))):
                self.jobs.append(Background(self._pin, f"planc-pin-{i}", dev, on_error=self._failed))
        except BaseException:  # a lane that cannot start: the started ones stop before the error leaves
            self.stop()
            raise

    def _pin(self) -> None:
        while True:
            with self.cond:
                k = self.next
                if self.stopping or self.error is not None or k >= len(self.ring):
                    return
                self.next = k + 1
            t0 = time.perf_counter()
            owner, view = pinned_ring(self.dev, self.nbytes)
            if self.on_pin is not None:
                self.on_pin(t0)
            with self.cond:
                if self.stopping:
                    return
                self.owners[k], self.ring[k] = owner, view
                self.cond.notify_all()

    def _failed(self, e: BaseException) -> None:
        with self.cond:
            self.error = e
            self.cond.notify_all()

    def wait(self, k: int) -> None:
        with self.cond:
            while self.ring[k] is None and self.error is None:
                self.cond.wait()
            if self.ring[k] is None:
                raise self.error

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
        for job in self.jobs:
            job.thread.join()
        self.ring = self.owners = None  # the ring is its loader's to give back, not the pinner's
