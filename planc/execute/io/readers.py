"""The readers' threads: a pool of `io.workers` threads that a load's reads are submitted to,
started before its first read (`start`), and kept between loads while the pinned ring is kept
(`planc.warm_up`, PLANC_RING=kept: `KEPT_READERS`), so that such a load takes them started instead
of starting its own and joining them when it is done (2-3 ms of a load).

A kept pool is idle between loads (its threads wait for work and hold no buffer: a read's buffer
is a ring slot, the load's). It belongs to the process that started it: a child made by `fork` has
none of its threads, so it starts its own.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class Readers(ThreadPoolExecutor):
    """The readers' pool of `workers` threads, of the process `pid`. Its threads start with an empty
    context (no load's settings: nothing a read runs reads them)."""

    def __init__(self, workers: int):
        super().__init__(max_workers=workers, thread_name_prefix="planc-read")
        self.workers, self.pid = workers, os.getpid()
        self.closed = False

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.closed = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


def start_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Have `pool` start `n` threads now (it otherwise starts one per submission, later)."""
    if n <= 0:
        return
    gate = threading.Barrier(n + 1, timeout=10)
    try:
        for _ in range(n):
            pool.submit(gate.wait)
        gate.wait()
    except threading.BrokenBarrierError:  # slow to start: the pool has the threads it has, and starts more
        pass                             # on demand
    except BaseException:  # a thread that cannot start, or Ctrl-C: no started thread may wait on
        gate.abort()       # the gate after the error has left (its owner's shutdown joins them)
        raise


def start(workers: int, n: int | None = None) -> Readers:
    """A readers' pool of `workers` threads, `n` of them (all by default) started now."""
    pool = Readers(workers)
    try:
        start_threads(pool, workers if n is None else min(n, workers))
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return pool


class KeptReaders:
    """At most one idle readers' pool kept for the next load of this process."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pool: Readers | None = None

    def take(self, workers: int) -> Readers | None:
        """The kept pool when it has `workers` threads and is this process's (it is the caller's
        until it gives it back), else None."""
        with self.lock:
            p = self.pool
            if p is None or p.workers != workers or p.pid != os.getpid() or p.closed:
                return None
            self.pool = None
            return p

    def give(self, pool: Readers, keep=lambda: True) -> Readers | None:
        """Keep `pool` (idle: the load that used it is done) for the next load if `keep()`, asked
        under this lock (so a `drop` after the answer finds the pool: `planc.release_ring` drops the
        kept ring first, then this); returns what is to be shut down: the pool it replaces, or `pool`
        itself when it is not kept (`keep()` false, another process's, shut down already)."""
        if pool.pid != os.getpid() or pool.closed:
            return pool
        with self.lock:
            if not keep():
                return pool
            old, self.pool = self.pool, pool
        return None if old is pool else old

    def drop(self) -> Readers | None:
        """The kept pool, handed to the caller to shut down; none is kept after."""
        with self.lock:
            p, self.pool = self.pool, None
        return p if p is not None and p.pid == os.getpid() else None


KEPT_READERS = KeptReaders()


def _forked() -> None:  # a child made by fork: none of the kept threads, and a lock no one holds
    KEPT_READERS.lock = threading.Lock()
    KEPT_READERS.pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def retire(pool: Readers | None) -> None:
    """Shut `pool` down off the caller's path: its idle threads end on their own."""
    if pool is not None:
        pool.shutdown(wait=False)


def hand_back(pool: Readers, keep) -> None:
    """`pool` (idle) kept for the next load if `keep()` (`KEPT_READERS.give`), else ended here and
    joined; a pool it replaces is ended off the caller's path."""
    out = KEPT_READERS.give(pool, keep)
    if out is pool:
        pool.shutdown(wait=True)
    else:
        retire(out)
