"""What a load tells its observer: typed, immutable event records.

`execute(plan, observer=fn)` calls `fn(event)` for each. The events of the pipeline's own thread
come in order: `RunStarted`, then for each request `ReadDone` (the read, timed on the reader's
thread) and `CopyIssued`, for a host-path part a `CopyIssued` per slot it is staged through and
`HostPartDone`, `KernelsLaunched` once the run's kernels are on the stream, `RunDone`, and once per
load `LoadEnded`; `RunWaited` when a run waits for the live room, `DeviceReady` once the device
regions are allocated. `Step` times one step of the load's machinery (allocation, the device
allocations, pinning a ring slot, a wait on a slot's event, the final synchronize, the release);
`Timed` a span the report's `timings` add up (a wait for a read, a pin, the warmer...). Pinning
steps come from the ring's own threads, so an observer must be safe to call from several threads
at once. The load's own counts and timings are such an observer (`meter.Meter`), and so are the
progress bar, `bench/timeline.py` and the fault tests; nothing wraps the pipeline's methods.

Every event carries `start` and `end` (`time.perf_counter()` seconds) and the name of the thread
that did the work.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable


def _thread() -> str:
    return threading.current_thread().name


@dataclass(frozen=True)
class Event:
    start: float = field(default_factory=time.perf_counter, kw_only=True)
    end: float = field(default_factory=time.perf_counter, kw_only=True)
    thread: str = field(default_factory=_thread, kw_only=True)


@dataclass(frozen=True)
class RunStarted(Event):
    run: int


@dataclass(frozen=True)
class ReadDone(Event):
    """Request `request` of run `run` is in its ring slot: `nbytes` read (strided: a strided read)."""
    run: int
    request: int
    nbytes: int
    strided: bool


@dataclass(frozen=True)
class CopyIssued(Event):
    """`copies` copies of `nbytes` payload issued from a ring slot (`request` None: a host-path part's);
    `kernels`: the kernels issued with them (a scattered request's scatter). `start`..`end`: the issue."""
    run: int
    request: int | None
    copies: int
    nbytes: int
    kernels: int = 0


@dataclass(frozen=True)
class HostPartDone(Event):
    """Host-path part `part` of run `run` is staged: `nbytes` out, read in `requests` reads."""
    run: int
    part: int
    nbytes: int
    requests: int = 0


@dataclass(frozen=True)
class RunWaited(Event):
    """Run `run` did not fit the live room and waited for everything in flight to finish."""
    run: int


@dataclass(frozen=True)
class DeviceReady(Event):
    """The device regions are allocated and the padding zero-filled: `copies` copies (the scatter
    table's upload) and `kernels` kernels (the zero-fill) issued for them; `start`..`end`: the wait."""
    copies: int
    kernels: int


@dataclass(frozen=True)
class KernelsLaunched(Event):
    """Run `run`'s `kernels` kernels are on the stream; `parts` tensor parts of the run are done."""
    run: int
    kernels: int
    parts: int


@dataclass(frozen=True)
class RunDone(Event):
    run: int


@dataclass(frozen=True)
class Step(Event):
    """One step of the load's machinery: `allocate`, `device_alloc`, `pin`, `slot_wait`, `warm`,
    `final_sync`, `free`, `run`."""
    name: str


@dataclass(frozen=True)
class Timed(Event):
    """A span the report's `timings[name]` adds up: `wait_reads`, `wait_pin`, `admit`,
    `wait_warm`, `prepare`, `release`."""
    name: str


@dataclass(frozen=True)
class LoadEnded(Event):
    """The load is over: `ok`, or the error's class name in `error`."""
    ok: bool
    error: str | None = None


Observer = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The observer of a load that has none."""


def fanout(*observers: Observer | None) -> Observer:
    """One observer calling each of `observers` (None ones left out) in order."""
    got = [o for o in observers if o is not None]
    if not got:
        return ignore
    if len(got) == 1:
        return got[0]

    def each(event: Event) -> None:
        for o in got:
            o(event)

    return each
