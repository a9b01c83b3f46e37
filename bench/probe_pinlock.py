"""Probe: which step of pinning a ring slot holds up copies issued meanwhile (run on the GPU machine).

    python3 bench/probe_pinlock.py [--slots 16] [--lanes 4]

A load issues `cuMemcpyHtoDAsync` from slots already pinned while lanes pin the rest. On the H200 the
first copy of a load was seen to return only when the last slot was pinned. Here one thread issues
small copies from a pinned buffer in a loop and records how long each call takes, while `--lanes`
threads do, in turn: nothing (the baseline); only the kernel's part (an anonymous 16 MiB mapping,
`MADV_HUGEPAGE`, `MADV_POPULATE_WRITE`); only the driver's part (`cuMemHostRegister` and
`cuMemHostUnregister` of slots populated beforehand); both (`driver.RegisteredMemory`, as the
ring does); and split (the lanes populate, then one thread registers every slot). The longest and
the summed copy calls say which part the copies wait for. 1 GiB is made and given back first, so
that the memory is backed by the VM before anything is timed.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--lanes", type=int, default=4)
    a = ap.parse_args()
    from planc.execute import driver, seam

    seam.select("cuda:0")
    slot = 16 << 20
    src = driver.pinned_array(1 << 20)
    dst = driver.device_bytes(1 << 20)
    stream = driver.Stream()
    lib = driver.lib()

    def populated(n: int) -> list:
        out = []
        for _ in range(n):
            base, length = driver._map_anonymous(slot)
            ptr = base + (-base) % (2 << 20)
            driver.libc().madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(slot), 14)
            driver._populate(ptr, slot)
            out.append((base, length, ptr))
        return out

    def unmap(maps: list) -> None:
        for base, length, _ptr in maps:
            driver.libc().munmap(ctypes.c_void_p(base), ctypes.c_size_t(length))

    def work(kind: str, jobs: list) -> None:
        for j in jobs:
            if kind in ("populate", "split"):
                got = populated(1)
                if kind == "split":
                    j.extend(got)  # registered afterwards, one slot after another, by one thread
                else:
                    unmap(got)
            elif kind == "register":
                driver.check(lib.cuMemHostRegister_v2(ctypes.c_void_p(j[2]), ctypes.c_size_t(slot), 0), "register")
                driver.check(lib.cuMemHostUnregister(ctypes.c_void_p(j[2])), "unregister")
            elif kind == "both":
                driver.RegisteredMemory(slot).free()

    unmap(populated(64))  # 1 GiB made and given back: the VM backs the memory the kinds below reuse
    for kind in ("none", "populate", "register", "both", "split", "none"):
        pre = populated(a.slots) if kind == "register" else [None] * a.slots
        per = [pre[i::a.lanes] for i in range(a.lanes)]
        if kind == "split":
            per = [[] for _ in range(a.lanes)]
        lat, stop = [], threading.Event()

        def copier():
            while not stop.is_set():
                t0 = time.perf_counter()
                driver.copy_h2d(dst.ptr, src.ctypes.data, 1 << 20, stream.handle)
                lat.append(time.perf_counter() - t0)
                stream.synchronize()

        def lane(jobs, kind=kind):
            seam.select("cuda:0")  # the load's lanes select its device too
            work(kind, jobs if kind != "split" else [jobs] * (a.slots // a.lanes))

        c = threading.Thread(target=copier)
        c.start()
        time.sleep(0.01)
        t0 = time.perf_counter()
        ths = [threading.Thread(target=lane, args=(j,)) for j in per]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        if kind == "split":  # then one thread registers every slot, in order
            done = [m for jobs in per for m in jobs]
            for _b, _l, ptr in done:
                driver.check(lib.cuMemHostRegister_v2(ctypes.c_void_p(ptr), ctypes.c_size_t(slot), 0), "register")
        wall = time.perf_counter() - t0
        if kind == "split":
            for _b, _l, ptr in done:
                lib.cuMemHostUnregister(ctypes.c_void_p(ptr))
            unmap(done)
        if kind == "register":
            unmap(pre)
        if kind == "none":
            time.sleep(0.05)
        stop.set()
        c.join()
        print(f"{kind:9s} lanes {a.lanes} slots {a.slots}: lanes' wall {wall * 1e3:7.1f} ms; copy calls n={len(lat)} "
              f"median {statistics.median(lat) * 1e6:7.1f} us, max {max(lat) * 1e3:7.2f} ms, "
              f"sum {sum(lat) * 1e3:7.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
