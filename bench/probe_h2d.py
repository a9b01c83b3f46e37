"""Where the warm-cache ceiling lies: reads, copies, and both at once, with raw driver calls.

    python3 bench/probe_h2d.py CKPT_DIR OUT.jsonl [--threads 16] [--chunk 16MiB] [--slots 16]

Page cache warm (the script reads the files first). Each mode moves every byte of the checkpoint's
*.safetensors files and reports GB/s:

* ``copy``: one pinned 1 GiB buffer copied to the device again and again (the link alone);
* ``read``: N threads `preadv` chunks from the page cache into a pinned ring (no copies);
* ``read_copy``: the same, each chunk then copied with `cuMemcpyHtoDAsync` (a plain pipeline with
  the issue loop in raw driver calls): how far host memory bandwidth lets reads and copies overlap;
* ``register``: no bounce buffer. Each chunk of the file's page-cache pages is mapped, registered
  with `cuMemHostRegister(READ_ONLY)` by a worker thread, copied by the GPU straight from the page
  cache, then unregistered; host memory traffic is one read of each byte instead of three.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import mmap
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import planc.execute  # noqa: E402,F401 - numpy alias for numba-cuda
from numba import cuda  # noqa: E402

from planc.units import parse_bytes  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
cu.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
cu.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
cu.cuEventSynchronize.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
READ_ONLY = 0x08
MAP_POPULATE = 0x8000


def ok(rc, what):
    if rc:
        raise RuntimeError(f"{what}: CUresult {rc}")


def stream_h(s):
    h = s.handle
    v = getattr(h, "value", None)
    return int(v if v is not None else int(h))


def new_event():
    e = ctypes.c_void_p()
    ok(cu.cuEventCreate(ctypes.byref(e), 2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
    return e


def jobs_of(files, chunk):
    out = []
    for f in files:
        size = os.path.getsize(f)
        for off in range(0, size, chunk):
            out.append((f, off, min(chunk, size - off)))
    return out


def mode_copy(total, dev, s):
    n = 1 << 30
    h = cuda.pinned_array(n, dtype=np.uint8)
    h[:] = 1
    sh = stream_h(s)
    base = dev.device_ctypes_pointer.value
    ok(cu.cuMemcpyHtoDAsync_v2(base, h.ctypes.data, n, sh), "copy")
    s.synchronize()
    reps = max(1, total // n)
    t0 = time.perf_counter()
    for _ in range(reps):
        ok(cu.cuMemcpyHtoDAsync_v2(base, h.ctypes.data, n, sh), "copy")
    s.synchronize()
    return reps * n, time.perf_counter() - t0


def mode_read(files, chunk, threads, slots, dev, s, copy: bool):
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    ring = [cuda.pinned_array(chunk, dtype=np.uint8) for _ in range(slots)]
    events = [new_event() for _ in range(slots)]
    used = [False] * slots
    sh = stream_h(s)
    dbase = dev.device_ctypes_pointer.value
    offs, pos = {}, 0
    for f in files:
        offs[f] = pos
        pos += os.path.getsize(f)

    def read(job, b):
        f, off, n = job
        mv = memoryview(ring[b])[:n]
        got = 0
        while got < n:
            got += os.preadv(fds[f], [mv[got:]], off + got)
        return job, b

    jobs = jobs_of(files, chunk)
    free = list(range(slots))
    pending = []
    moved = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        it = iter(jobs)
        done = False
        while not done or pending:
            while not done and free:
                job = next(it, None)
                if job is None:
                    done = True
                    break
                b = free.pop(0)
                if used[b]:
                    ok(cu.cuEventSynchronize(events[b]), "evsync")
                pending.append(pool.submit(read, job, b))
            if pending:
                (f, off, n), b = pending.pop(0).result()
                if copy:
                    ok(cu.cuMemcpyHtoDAsync_v2(dbase + offs[f] + off, ring[b].ctypes.data, n, sh), "copy")
                    ok(cu.cuEventRecord(events[b], sh), "record")
                    used[b] = True
                moved += n
                free.append(b)
    s.synchronize()
    dt = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return moved, dt


def mode_register(files, chunk, threads, dev, s, populate: bool):
    sh = stream_h(s)
    dbase = dev.device_ctypes_pointer.value
    offs, pos = {}, 0
    for f in files:
        offs[f] = pos
        pos += os.path.getsize(f)
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    ctx = cuda.current_context()
    times = {"map": 0.0, "register": 0.0, "unregister": 0.0}
    lock = threading.Lock()

    def prep(job):
        cuda.current_context()  # this thread gets the load's context
        f, off, n = job
        t0 = time.perf_counter()
        flags = mmap.MAP_SHARED | (MAP_POPULATE if populate else 0)
        addr = libc.mmap(None, n, mmap.PROT_READ, flags, fds[f], off)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        t1 = time.perf_counter()
        ok(cu.cuMemHostRegister_v2(addr, n, READ_ONLY), "register")
        t2 = time.perf_counter()
        with lock:
            times["map"] += t1 - t0
            times["register"] += t2 - t1
        return job, addr

    def release(addr, n, ev):
        cuda.current_context()
        ok(cu.cuEventSynchronize(ev), "evsync")
        t0 = time.perf_counter()
        ok(cu.cuMemHostUnregister(addr), "unregister")
        libc.munmap(addr, n)
        with lock:
            times["unregister"] += time.perf_counter() - t0

    jobs = jobs_of(files, chunk)
    depth = 2 * threads
    moved = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool, ThreadPoolExecutor(4) as rel:
        pending = [pool.submit(prep, j) for j in jobs[:depth]]
        nxt = depth
        releases = []
        while pending:
            (f, off, n), addr = pending.pop(0).result()
            ok(cu.cuMemcpyHtoDAsync_v2(dbase + offs[f] + off, addr, n, sh), "copy")
            ev = new_event()
            ok(cu.cuEventRecord(ev, sh), "record")
            releases.append(rel.submit(release, addr, n, ev))
            moved += n
            if nxt < len(jobs):
                pending.append(pool.submit(prep, jobs[nxt]))
                nxt += 1
        s.synchronize()
        for r in releases:
            r.result()
    dt = time.perf_counter() - t0
    del ctx
    for fd in fds.values():
        os.close(fd)
    return moved, dt, times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--chunk", default="16MiB")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--modes", default="copy,read,read_copy,register")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.ckpt, "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    chunk = parse_bytes(a.chunk)
    for f in files:  # warm the page cache
        with open(f, "rb", buffering=0) as h:
            while h.read(64 << 20):
                pass
    cuda.select_device(0)
    dev = cuda.device_array(total, dtype=np.uint8)
    s = cuda.stream()
    log = open(a.out, "a")
    for rep in range(a.repeat):
        for mode in a.modes.split(","):
            extra = {}
            if mode == "copy":
                n, dt = mode_copy(total, dev, s)
            elif mode in ("read", "read_copy"):
                n, dt = mode_read(files, chunk, a.threads, a.slots, dev, s, mode == "read_copy")
            elif mode in ("register", "register_populate"):
                n, dt, extra = mode_register(files, chunk, a.threads, dev, s, mode == "register_populate")
            else:
                raise SystemExit(f"unknown mode {mode}")
            row = {"mode": mode, "rep": rep, "bytes": n, "seconds": dt, "gb_per_s": n / dt / 1e9,
                   "threads": a.threads, "chunk": chunk, **extra}
            print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
