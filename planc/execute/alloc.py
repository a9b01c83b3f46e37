"""Device and pinned allocations, and their prompt release.

numba defers freeing device and pinned memory until its deallocation queues fill; a loader must
give memory back when it says so, so `release()` flushes them. There are two: the memory
manager's (device and pinned memory) and the context's (streams, events, modules).
"""

from __future__ import annotations

import gc

import numpy as np
from numba import cuda

from .seam import simulated

ALIGN = 4096


def device_bytes(n: int):
    return cuda.device_array(max(1, n), dtype=np.uint8)


def pinned_ring(nbytes: int):
    """A pinned uint8 buffer of `nbytes` whose start is 4 KiB aligned (O_DIRECT), and its owner."""
    owner = cuda.pinned_array(nbytes + ALIGN, dtype=np.uint8)
    addr = owner.ctypes.data
    base = (-addr) % ALIGN
    return owner, owner[base:base + nbytes]


def event():
    if simulated():
        return cuda.event()
    return cuda.event(timing=False)


def release(full: bool = True) -> None:
    """Give deferred device and pinned frees back now.

    `full` collects every generation (after a failure, whose traceback frames hold arrays in
    cycles); after a clean load the young generations suffice (a full collection costs about
    50 ms in a process with numba loaded).
    """
    gc.collect() if full else gc.collect(1)
    if simulated():
        return
    try:
        ctx = cuda.current_context()
    except Exception:  # noqa: BLE001 - no context yet: nothing to release
        return
    for queue in (getattr(ctx.memory_manager, "deallocations", None), ctx.deallocations):
        if queue is not None:
            queue.clear()
