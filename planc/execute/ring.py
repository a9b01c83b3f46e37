"""The pinned ring and the loader's background threads.

`Slots` is the ring (a list that can be weakly referenced, so tests can watch it go); `Pinner`
pins its slots one by one, in order, on a thread of its own, so that slot k's pinning overlaps
the reads and copies already running in slots < k; `Background` runs a function on a thread of
its own, on the caller's device.
"""

from __future__ import annotations

from . import seam
from .seam import pinned_ring


class Slots(list):
    """The ring's slots (a list that can be weakly referenced, so tests can watch it go)."""


class Background:
    """Run `fn` on a thread of its own, on the caller's device (selected in the thread, whatever a
    new thread would default to); `wait()` returns or re-raises its error, which `on_error` also
    receives at once."""

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


class Pinner:
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
        self.job = Background(self._pin, "planc-pin", on_error=self._failed)

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
