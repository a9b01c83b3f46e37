"""Probe: what a tensor-parallel rank's row-parallel slice costs to read and to copy, by method.

    python3 bench/probe_strided.py DATA_DIR [--gib 4] [--threads 1,8,16]

A dim-1 slice of a row-major [R, C] weight is R segments of C/N elements, a row apart. Measured
here on one file in the page cache (warm), payload GB/s of:
- `mmapN`: each thread maps a window of N MiB of the file (`--windows`), copies its segments with
  numpy (GIL released), unmaps; only the segments' pages are touched (threads = mapping lanes);
  `mmapNp` the same with each window populated as it is mapped (`MAP_POPULATE`);
- `pread-seg`: one `os.preadv` per segment from Python;
- `pread-rows`: whole rows read (buffered), the bytes a rank does not need included;
- `pread-gap`: one `preadv` per 512 rows through ctypes, the segments into the output and the bytes
  between them into one small scratch buffer (nothing mapped, no Python per segment);
and on the GPU (cupy), a slot of whole rows to the device as one 2-D copy (`cudaMemcpy2DAsync`,
row pitch -> packed) against one 1-D copy of the same payload.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _file(data: Path, gib: int) -> Path:
    p = data / f"strided-{gib}g.bin"
    if not p.exists() or p.stat().st_size != gib << 30:
        data.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        block = rng.integers(0, 255, 64 << 20, dtype=np.uint8)
        with open(p, "wb") as f:
            for _ in range(gib * 16):
                f.write(block.tobytes())
    with open(p, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    return p


def _mmap_job(fd, size, start, seg, stride, rows, out, window, flags=mmap.MAP_SHARED):
    """Copy `rows` segments at start + k * stride into out (packed), mapping `window` bytes at a time."""
    k = 0
    page = mmap.PAGESIZE
    while k < rows:
        lo = start + k * stride
        per = max(1, window // stride)
        m = min(per, rows - k)
        a = lo // page * page
        hi = lo + (m - 1) * stride + seg
        mm = mmap.mmap(fd, hi - a, flags=flags, prot=mmap.PROT_READ, offset=a)
        try:
            src = np.frombuffer(mm, np.uint8)
            view = np.lib.stride_tricks.as_strided(src[lo - a:], (m, seg), (stride, 1))
            np.copyto(out[k * seg:(k + m) * seg].reshape(m, seg), view)
            del src, view
        finally:
            mm.close()
        k += m


def _mmap_populate_job(fd, size, start, seg, stride, rows, out, window):
    """As `_mmap_job`, each window populated as it is mapped (MAP_POPULATE): every page of it
    resident while it is mapped, not faulted in as the copy goes."""
    _mmap_job(fd, size, start, seg, stride, rows, out, window, mmap.MAP_SHARED | mmap.MAP_POPULATE)


def _pread_seg_job(fd, size, start, seg, stride, rows, out, window):
    mv = memoryview(out)
    for k in range(rows):
        os.preadv(fd, [mv[k * seg:(k + 1) * seg]], start + k * stride)


def _pread_rows_job(fd, size, start, seg, stride, rows, out, window):
    buf = np.empty(min(rows, 1024) * stride, np.uint8)
    k = 0
    while k < rows:
        m = min(1024, rows - k)
        os.preadv(fd, [memoryview(buf)[:m * stride]], start + k * stride)
        np.copyto(out[k * seg:(k + m) * seg].reshape(m, seg),
                  np.lib.stride_tricks.as_strided(buf, (m, seg), (stride, 1)))
        k += m


IOV_MAX = 1024


def _pread_gap_job(fd, size, start, seg, stride, rows, out, window):
    """Whole rows read with one `preadv` per 512 of them, each row's segment into `out` (packed) and
    the bytes between segments into one small scratch buffer that stays in the CPU cache: nothing
    mapped, no Python per segment (the iovecs are written by numpy, the call made through ctypes,
    which releases the GIL), but every byte between the segments copied by the kernel."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    preadv = libc.preadv
    preadv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_long]
    preadv.restype = ctypes.c_ssize_t
    gap = stride - seg
    scratch = np.empty(max(1, gap), np.uint8)
    per = IOV_MAX // 2
    iov = np.empty((per, 2, 2), np.uint64)  # (row, [segment, gap], [base, len])
    iov[:, 1, 0] = scratch.ctypes.data
    iov[:, 1, 1] = gap
    iov[:, 0, 1] = seg
    base = out.ctypes.data
    k = 0
    while k < rows:
        m = min(per, rows - k)
        iov[:m, 0, 0] = base + (k + np.arange(m, dtype=np.uint64)) * seg
        n_iov = 2 * m - 1  # the last row's gap is not read
        want = m * stride - gap
        got = preadv(fd, iov.ctypes.data, n_iov, start + k * stride)
        if got != want:
            raise OSError(ctypes.get_errno(), f"preadv: {got} of {want} bytes")
        k += m


def check(path: Path, fn, seg: int, stride: int, window: int, name: str, rows: int = 1500) -> None:
    """One job of `rows` segments against numpy's slicing of the file; a mismatch stops the probe."""
    src = np.memmap(path, np.uint8, "r")
    start = min(64, stride - seg)
    out = np.empty(rows * seg, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        fn(fd, path.stat().st_size, start, seg, stride, rows, out, window)
    finally:
        os.close(fd)
    want = np.lib.stride_tricks.as_strided(src[start:], (rows, seg), (stride, 1)).reshape(-1)
    if not np.array_equal(out, want):
        raise SystemExit(f"{name}: seg {seg} stride {stride}: bytes differ from the file's")


def host_probe(path: Path, threads: int, seg: int, stride: int, method, window: int, repeat: int) -> dict:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    rows_total = size // stride
    per = rows_total // threads
    outs = [np.empty(per * seg, np.uint8) for _ in range(threads)]
    times = []
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(threads) as ex:
                futs = [ex.submit(method, fd, size, t * per * stride + min(64, stride - seg), seg, stride, per - 1, outs[t], window)
                        for t in range(threads)]
                for f in futs:
                    f.result()
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    payload = threads * (per - 1) * seg
    t = statistics.median(times)
    return {"payload_bytes": payload, "seconds": t, "gbps": payload / t / 1e9, "segments": threads * (per - 1)}


def gpu_probe(seg: int, stride: int, slot: int, repeat: int) -> dict:
    import cupy as cp

    rows = slot // stride
    host = cp.cuda.alloc_pinned_memory(slot)
    hv = np.frombuffer(host, np.uint8, slot)
    hv[:] = np.random.default_rng(1).integers(0, 255, slot, dtype=np.uint8)
    dev = cp.empty(rows * seg, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime
    out = {}
    for name in ("2d", "1d"):
        ts = []
        for _ in range(repeat):
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(8):
                if name == "2d":
                    rt.memcpy2DAsync(dev.data.ptr, seg, host.ptr, stride, seg, rows, rt.memcpyHostToDevice, stream.ptr)
                else:
                    rt.memcpyAsync(dev.data.ptr, host.ptr, rows * seg, rt.memcpyHostToDevice, stream.ptr)
            stream.synchronize()
            ts.append((time.perf_counter() - t0) / 8)
        t = statistics.median(ts)
        out[name] = {"seconds": t, "gbps": rows * seg / t / 1e9}
    got = cp.asnumpy(dev)
    rt.memcpy2DAsync(dev.data.ptr, seg, host.ptr, stride, seg, rows, rt.memcpyHostToDevice, stream.ptr)
    stream.synchronize()
    want = np.lib.stride_tricks.as_strided(hv, (rows, seg), (stride, 1)).reshape(-1)
    out["2d_exact"] = bool(np.array_equal(cp.asnumpy(dev), want))
    del got
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path)
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--windows", default="2,8,32", help="mmap window sizes in MiB (a `mmapN` row each)")
    ap.add_argument("--shapes", default="", help="seg:stride pairs, comma-separated (default: five shapes)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", default="", help="a subset of mmapN, pread-rows, pread-gap, pread-seg (default: all)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the 2-D copy probe")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    path = _file(a.data, a.gib)
    shapes = ([tuple(int(v) for v in x.split(":")) for x in a.shapes.split(",")] if a.shapes
              else [(1024, 8192), (3584, 28672), (2048, 4096), (8192, 16384), (2, 16)])
    mmaps = [(f"mmap{w}", _mmap_job, int(w) << 20) for w in a.windows.split(",")]
    mmaps += [(f"mmap{w}p", _mmap_populate_job, int(w) << 20) for w in a.windows.split(",")]
    methods = (*mmaps, ("pread-rows", _pread_rows_job, 0), ("pread-gap", _pread_gap_job, 0),
               ("pread-seg", _pread_seg_job, 0))
    if a.methods:
        names = a.methods.split(",")
        unknown = sorted(set(names) - {m[0] for m in methods})
        if unknown:
            ap.error(f"unknown --methods {unknown}: mmapN and mmapNp name a window of --windows; "
                     f"the others are pread-rows, pread-gap, pread-seg")
        methods = [m for m in methods if m[0] in names]
    rows = []
    for seg, stride in shapes:
        for name, fn, window in methods:
            check(path, fn, seg, stride, window, name)
        for th in (int(x) for x in a.threads.split(",")):
            for name, fn, window in methods:
                if name == "pread-seg" and seg < 1024:
                    continue
                if name == "pread-seg" and th == 1 and seg * 2 < stride:
                    r = host_probe(path, th, seg, stride, fn, window, 1)
                else:
                    r = host_probe(path, th, seg, stride, fn, window, a.repeat)
                rows.append({"method": name, "seg": seg, "stride": stride, "threads": th, **r})
                print(f"{name:10} seg {seg:6} stride {stride:6} threads {th:2}: {r['gbps']:7.2f} GB/s payload "
                      f"({r['segments'] / r['seconds'] / 1e6:.1f} M seg/s)", flush=True)
    try:
        for seg, stride in [] if a.no_gpu else shapes[:4]:
            g = gpu_probe(seg, stride, 16 << 20, 5)
            rows.append({"method": "h2d", "seg": seg, "stride": stride, **g})
            print(f"h2d seg {seg} stride {stride}: 2d {g['2d']['gbps']:.2f} GB/s, 1d {g['1d']['gbps']:.2f} GB/s, "
                  f"exact {g['2d_exact']}", flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"gpu probe failed: {e!r}", file=sys.stderr)
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
