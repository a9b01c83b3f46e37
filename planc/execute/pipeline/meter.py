"""The load's counts and timings, folded from its events: events -> `Counts` and phase -> seconds.

`Meter` is an observer (`events.Observer`) like any other: `execute` puts it first among the
load's observers, and the report is built from what it folded (`records.Report.build`). No part of
the pipeline adds to a shared tally; each tells its observer what it did:

- requests: a `CopyIssued` of a ring request (`request` not None), and a host-path part's reads
  (`HostPartDone.requests`);
- copies: every `CopyIssued` (a host-path part's slots included) and the scatter table's upload
  (`DeviceReady.copies`);
- kernels: `KernelsLaunched` (whose span is the `launch` time: a run's kernels issued on their
  stream, in Python), a scattered request's scatter (`CopyIssued.kernels`) and the
  padding's zero-fill (`DeviceReady.kernels`);
- host parts: `HostPartDone`; run waits: `RunWaited`;
- timings: the `Step`s `allocate`, `final_sync`, `free` and `slot_wait` (as `wait_slots`), each
  `Timed` span under its name, the wait for the device regions (`DeviceReady`, as `wait_device`)
  and the issue of each request's copies (`CopyIssued`, as `issue`); `record` puts a phase timed
  outside the load (the API's compile, the whole call).

Events come from several threads (the ring's pinning lanes, the readers): the fold takes a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .events import CopyIssued, DeviceReady, Event, HostPartDone, KernelsLaunched, RunWaited, Step, Timed

# the phases every report times, in the order the report lists them (others follow as they happen)
PHASES = ("allocate", "wait_reads", "wait_slots", "wait_pin", "issue", "launch", "admit", "final_sync")
_STEPS = {"allocate": "allocate", "final_sync": "final_sync", "free": "free", "slot_wait": "wait_slots"}


@dataclass(frozen=True)
class Counts:
    """What one load issued."""
    requests: int = 0
    copies: int = 0
    kernels: int = 0
    host_parts: int = 0
    run_waits: int = 0


class Meter:
    """Folds a load's events into its `counts()` and `timings()` (call it with each event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = dict.fromkeys(("requests", "copies", "kernels", "host_parts", "run_waits"), 0)
        self._t = dict.fromkeys(PHASES, 0.0)

    def __call__(self, e: Event) -> None:
        n, t = self._n, self._t
        with self._lock:
            if isinstance(e, CopyIssued):
                n["copies"] += e.copies
                n["kernels"] += e.kernels
                if e.request is not None:
                    n["requests"] += 1
                    t["issue"] += e.end - e.start
            elif isinstance(e, KernelsLaunched):
                n["kernels"] += e.kernels
                t["launch"] += e.end - e.start
            elif isinstance(e, HostPartDone):
                n["host_parts"] += 1
                n["requests"] += e.requests
            elif isinstance(e, RunWaited):
                n["run_waits"] += 1
            elif isinstance(e, DeviceReady):
                n["copies"] += e.copies
                n["kernels"] += e.kernels
                self._add("wait_device", e.end - e.start)
            elif isinstance(e, Timed):
                self._add(e.name, e.end - e.start)
            elif isinstance(e, Step) and e.name in _STEPS:
                self._add(_STEPS[e.name], e.end - e.start)

    def _add(self, phase: str, seconds: float) -> None:
        self._t[phase] = self._t.get(phase, 0.0) + seconds

    def record(self, phase: str, seconds: float) -> None:
        """A phase timed outside the load's events (the API's compile; the whole call): `seconds`."""
        with self._lock:
            self._t[phase] = seconds

    def counts(self) -> Counts:
        with self._lock:
            return Counts(**self._n)

    def timings(self) -> dict:
        """Phase -> seconds, in the order the phases were first timed (`PHASES` first)."""
        with self._lock:
            return dict(self._t)
