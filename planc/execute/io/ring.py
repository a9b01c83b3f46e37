"""The pinned ring and the loader's background threads.

`Slots` is the ring (a list that can be weakly referenced, so tests can watch it go); `Pinner`
pins its slots in order on a few threads of its own, so that slot k's pinning overlaps the reads
and copies already running in slots < k; `Background` runs a function on a thread of
its own, on the device it is given (at the index the caller's thread has selected there); `KEPT`
holds the pinned slots that finished loads left for the next (PLANC_RING=kept, `planc.warm_up`).
"""

from __future__ import annotations

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
    """Pinned ring slots kept between the loads of this process, by device and slot size.

    A load takes what is kept for its device (the same `Device` object at the same index, pinned the
    same way) and slot size before it pins any (`take`), and, when its rings are kept (PLANC_RING=kept,
    or `keep(True)`: `planc.warm_up`), gives its slots back when it is done (`give`); otherwise they
    are unpinned as before. At most one ring per device and slot size is held (the largest given);
    slots beyond it are handed back to be unpinned. `drop` gives everything back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held: dict = {}  # (id(dev), index, pin method, slot bytes) -> (dev, [(owner, view), ...])
        self.keeping = False  # `keep(True)`: rings are kept whatever the load's setting

    @staticmethod
    def _key(dev, slot: int) -> tuple:
        return id(dev), dev.current_device(), dev.pin_method(), slot

    def available(self, dev, slot: int) -> int:
        """How many slots of `slot` bytes are kept for `dev`."""
        with self.lock:
            entry = self.held.get(self._key(dev, slot))
            return len(entry[1]) if entry and entry[0] is dev else 0

    def take(self, dev, slot: int, n: int) -> list:
        """Up to `n` kept slots of `slot` bytes for `dev`, as (owner, view) pairs; they are the
        caller's until it gives them back."""
        with self.lock:
            key = self._key(dev, slot)
            entry = self.held.get(key)
            if not entry or entry[0] is not dev:
                return []
            got, rest = entry[1][:n], entry[1][n:]
            if rest:
                self.held[key] = (dev, rest)
            else:
                del self.held[key]
            return got

    def give(self, dev, slot: int, pairs: list) -> list:
        """Keep `pairs` (pinned slots of `slot` bytes on `dev`); returns those not kept (to unpin)."""
        with self.lock:
            key = self._key(dev, slot)
            entry = self.held.get(key)
            have = entry[1] if entry and entry[0] is dev else []
            if len(have) >= len(pairs):
                return list(pairs)
            self.held[key] = (dev, list(pairs))
            return have

    def keep(self, on: bool) -> None:
        with self.lock:
            self.keeping = on

    def drop(self) -> list:
        """Everything kept, handed to the caller to unpin; rings are no longer kept unless the
        load's setting says so."""
        with self.lock:
            out = [p for _, pairs in self.held.values() for p in pairs]
            self.held.clear()
            self.keeping = False
            return out

    def held_bytes(self) -> int:
        with self.lock:
            return sum(len(pairs) * key[3] for key, (_, pairs) in self.held.items())


KEPT = KeptRing()
