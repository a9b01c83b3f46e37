"""The parts a load is composed of, as a value: `execute(plan, parts=Parts(...))`.

Each field is a factory `execute` calls, in this order, to build the load's pipeline (the defaults
are the real parts; a test or a bench passes its own, e.g. a reader that fails on its k-th read):

- `regions(plan, dev, stream, observer)` -> `allocation.Regions`: the device allocations begin (on
  a thread of their own);
- `warmer(plan, dev)` -> a thread loading the plan's kernels, or None (`kernelruns.warm_kernels`);
- `reader(plan)` -> `reader.Reader` with every checkpoint file open (`allocation.open_reader`);
- `pool(plan)` -> the executor the reads are submitted to, its threads started (`allocation.open_pool`);
- `kernels(plan, dev, stream, regions, warmer, observer)` -> `kernelruns.KernelRuns`;
- `host(plan, dev, stream, regions, reader, observer)` -> `hostpath.HostPath`;
- `live_room(reserve_bytes, run=None)` -> `memory.LiveRoom`: the host room now (`run` None: the
  plan's admission; else the run about to start);
- `observer`: an observer of every load's events besides the caller's (None: none).

Each part reports what it did to the observer it is given (`events`); the load's counts and
timings are folded from those events (`meter.Meter`), so a part holds no tally of its own.

`DEFAULT` is what a load without `parts=` is composed of: the command line's loads are too, so a
test that drives `planc run` gives its parts there (the one hook a test sets; nothing else in the
executor is patched).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .allocation import Regions, open_pool, open_reader
from .hostpath import HostPath
from .kernelruns import KernelRuns, warm_kernels
from ..device.memory import live_room


@dataclass(frozen=True)
class Parts:
    regions: Callable = Regions.start
    warmer: Callable = warm_kernels
    reader: Callable = open_reader
    pool: Callable = open_pool
    kernels: Callable = KernelRuns
    host: Callable = HostPath
    live_room: Callable = live_room
    observer: Callable | None = None


DEFAULT = Parts()
