"""The pinned ring and the loader's background threads.

`Slots` is the ring (a list that can be weakly referenced, so tests can watch it go); `Pinner`
pins its slots in order on a few threads of its own, so that slot k's pinning overlaps the reads
and copies already running in slots < k; `Background` runs a function on a thread of
its own, on the device it is given (at the index the caller's thread has selected there); `KEPT`
holds the pinned slots that finished loads left for the next (PLANC_RING=kept, `planc.warm_up`).
"""

from __future__ import annotations

import os
import threading
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

    def __init__(self, ring: list, owners: list, nbytes: int, dev, lanes: int | None = None, on_pin=None,
                 pinned: list = ()):
        self.ring, self.owners, self.nbytes, self.dev = ring, owners, nbytes, dev
        self.on_pin = on_pin  # called with each slot's pinning start (`time.perf_counter()`), on its lane
        self.cond = threading.Condition()
        for k, (owner, view) in enumerate(pinned):  # slots pinned already (`KEPT`): the first ones
            self.owners[k], self.ring[k] = owner, view
        self.next = len(pinned)  # the next slot a lane takes
        self.error: BaseException | None = None
        self.stopping = False
        self.jobs: list[Background] = []
        try:
            for i in range(min(self.LANES if lanes is None else lanes, len(ring) - self.next)):
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


class KeptRing:
    """Pinned ring slots kept between the loads of this process: at most one ring per device.

    A load takes what is kept for its device (the same `Device` object at the same index), pinned
    the same way and of its slot size, before it pins any (`take`, at its admission), and, when its
    rings are kept (PLANC_RING=kept, or `keep(True)`: `planc.warm_up`), gives its slots back when it
    is done (`give`); otherwise they are unpinned as before. The ring held for a device has at most
    as many slots as the largest ring given for it with that slot size; a ring of another slot size
    or pin method replaces it (the one it replaces is handed back to be unpinned), so two rings of a
    device are never held at once. `drop` gives everything back."""

    def __init__(self):
        self.lock = threading.Lock()
        # (id(dev), index) -> [dev, (pin method, slot bytes), [(owner, view), ...], most slots given]
        self.held: dict = {}
        self.keeping = False  # `keep(True)`: rings are kept whatever the load's setting

    @staticmethod
    def _where(dev) -> tuple:
        """The key of `dev`'s ring, and how `dev` pins."""
        return (id(dev), dev.current_device()), dev.pin_method()

    def _entry(self, dev, slot: int):
        """`dev`'s kept ring when it is of `slot` bytes pinned as `dev` pins, else None."""
        key, pin = self._where(dev)
        e = self.held.get(key)
        return e if e is not None and e[0] is dev and e[1] == (pin, slot) else None

    def available(self, dev, slot: int) -> int:
        """How many slots of `slot` bytes are kept for `dev`."""
        with self.lock:
            e = self._entry(dev, slot)
            return len(e[2]) if e else 0

    def take(self, dev, slot: int, n: int) -> list:
        """Up to `n` kept slots of `slot` bytes for `dev`, as (owner, view) pairs; they are the
        caller's until it gives them back."""
        with self.lock:
            e = self._entry(dev, slot)
            if not e:
                return []
            got, e[2] = e[2][:n], e[2][n:]
            return got

    def give(self, dev, slot: int, pairs: list, keep=lambda: True) -> list:
        """Keep `pairs` (pinned slots of `slot` bytes on `dev`) with what is kept of that ring, up to
        its largest size, if `keep()`, asked under this lock (so a `drop` after the answer finds
        them: `planc.release_ring` meanwhile unpins them); returns the slots not kept (to unpin):
        `pairs` itself when `keep()` is false, else those beyond that size, or those of a ring of `dev`
        with another slot size or pin method, which this one replaces."""
        if not pairs:
            return []
        with self.lock:
            if not keep():
                return pairs
            same = self._entry(dev, slot)
            if same is not None:
                most = max(same[3], len(pairs))
                merged = same[2] + list(pairs)
                same[2], same[3] = merged[:most], most
                return merged[most:]
            key, pin = self._where(dev)
            old = self.held.get(key)
            self.held[key] = [dev, (pin, slot), list(pairs), len(pairs)]
            return old[2] if old is not None else []

    def keep(self, on: bool) -> None:
        with self.lock:
            self.keeping = on

    def drop(self) -> list:
        """Everything kept, handed to the caller to unpin; rings are no longer kept unless the
        load's setting says so."""
        with self.lock:
            out = [p for e in self.held.values() for p in e[2]]
            self.held.clear()
            self.keeping = False
            return out

    def held_bytes(self) -> int:
        with self.lock:
            return sum(len(e[2]) * e[1][1] for e in self.held.values())


KEPT = KeptRing()


def _forked() -> None:  # a child made by fork: no pinned ring (the parent's CUDA state is not its own)
    KEPT.lock = threading.Lock()
    KEPT.held = {}
    KEPT.keeping = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
