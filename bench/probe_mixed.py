"""Probe: do a rank's mapped strided reads slow the plain reads that run beside them?

    python3 bench/probe_mixed.py DATA_DIR [--seconds 0.6] [--repeat 3]

A tensor-parallel rank's load runs both at once: plain `preadv`s of its contiguous slices into
ring slots, and strided reads of its row-parallel slices through read-only mappings of the file
(`Reader.read_strided`: map a window, copy the segments with numpy, unmap). Every unmap flushes the
TLB of every core the process runs on, and takes the process's memory-map lock for writing, which
page faults wait for. This probe runs, on two files in the page cache (warm), for a fixed time each:

- `pread N`: N threads, each reading 16 MiB pieces of the first file into its own buffer;
- `map M xW`: M threads copying 1 KiB segments 8 KiB apart (an `o_proj` slice at TP 8) out of the
  second file through W MiB windows, mapped and unmapped per window, as the executor does;
- `persist M`: the same copies out of one mapping of the whole file, made once (no unmaps);
- `populate M xW`: windows mapped with MAP_POPULATE (one fault pass, then the copy);
- `rows M`: no mapping: whole rows read with `preadv` into a scratch buffer, the segments copied out;
- and each of those beside `pread 12`, with both kinds' GB/s measured over the same interval.

Prints one line per case and round (GB/s of each kind) and the medians; writes OUT lines to
`--out` (JSON lines) if given.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

SEG, STRIDE = 1024, 8192
PIECE = 16 << 20


def _file(data: Path, name: str, gib: int) -> Path:
    p = data / name
    if not p.exists() or p.stat().st_size != gib << 30:
        data.mkdir(parents=True, exist_ok=True)
        block = np.random.default_rng(len(name)).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
        with open(p, "wb") as f:
            for _ in range(gib * 16):
                f.write(block)
    with open(p, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    return p


def _buffer(n: int) -> np.ndarray:
    m = mmap.mmap(-1, n)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass
    a = np.frombuffer(m, np.uint8)
    a[::4096] = 1  # touched once, as a pinned ring slot is
    return a


def _pread_worker(fd, size, k, stop, done, buf):
    mv = memoryview(buf)
    off = (k * 7919 * PIECE) % (size - PIECE) // PIECE * PIECE
    n = 0
    while not stop.is_set():
        n += os.preadv(fd, [mv], off)
        off = (off + PIECE) % (size - PIECE)
    done[k] = n


def _strided_worker(kind, fd, size, k, stop, done, out, window, whole):
    page = mmap.PAGESIZE
    per = max(1, window // STRIDE)
    span = per * STRIDE
    lo = (k * 104729 * span) % (size - span) // span * span
    n = 0
    scratch = np.empty(span, np.uint8) if kind == "rows" else None
    while not stop.is_set():
        dst = out[:per * SEG].reshape(per, SEG)
        if kind == "persist":
            view = np.lib.stride_tricks.as_strided(whole[lo:], (per, SEG), (STRIDE, 1), writeable=False)
            np.copyto(dst, view)
        elif kind == "rows":
            os.preadv(fd, [memoryview(scratch)], lo)
            np.copyto(dst, np.lib.stride_tricks.as_strided(scratch, (per, SEG), (STRIDE, 1)))
        else:
            a = lo // page * page
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if kind == "populate" else 0)
            mm = mmap.mmap(fd, lo + (per - 1) * STRIDE + SEG - a, flags=flags, prot=mmap.PROT_READ, offset=a)
            try:
                src = np.frombuffer(mm, np.uint8)
                view = np.lib.stride_tricks.as_strided(src[lo - a:], (per, SEG), (STRIDE, 1), writeable=False)
                np.copyto(dst, view)
                del src, view
            finally:
                mm.close()
        n += per * SEG
        lo = (lo + span) % (size - span) // page * page
    done[k] = n


def run_case(plain, strided, preads: int, kind: str | None, lanes: int, window: int, seconds: float) -> dict:
    stop = threading.Event()
    pdone, sdone = [0] * preads, [0] * lanes
    fd_p, fd_s = os.open(plain, os.O_RDONLY), os.open(strided, os.O_RDONLY)
    size_p, size_s = os.fstat(fd_p).st_size, os.fstat(fd_s).st_size
    whole_map = whole = None
    if kind == "persist":
        whole_map = mmap.mmap(fd_s, size_s, prot=mmap.PROT_READ)
        whole = np.frombuffer(whole_map, np.uint8)
    bufs = [_buffer(PIECE) for _ in range(preads)]
    outs = [_buffer(window) for _ in range(lanes if kind else 0)]
    ts = [threading.Thread(target=_pread_worker, args=(fd_p, size_p, k, stop, pdone, bufs[k])) for k in range(preads)]
    if kind:
        ts += [threading.Thread(target=_strided_worker, args=(kind, fd_s, size_s, k, stop, sdone, outs[k], window, whole))
               for k in range(lanes)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    del whole
    if whole_map is not None:
        whole_map.close()
    os.close(fd_p)
    os.close(fd_s)
    return {"pread_gbps": sum(pdone) / dt / 1e9, "strided_gbps": sum(sdone) / dt / 1e9, "seconds": dt}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=0.6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    plain = _file(a.data, f"plain-{a.gib}g.bin", a.gib)
    strided = _file(a.data, f"strided-{a.gib}g.bin", a.gib)
    mib = 1 << 20
    cases = [("pread 16", 16, None, 0, mib), ("pread 12", 12, None, 0, mib)]
    for kind, lanes, window in (("map", 4, 8), ("map", 4, 32), ("map", 16, 32), ("persist", 4, 8),
                                ("populate", 4, 8), ("rows", 4, 8)):
        label = f"{kind} {lanes}" + (f" x{window}" if kind in ("map", "populate") else "")
        cases.append((label, 0, kind, lanes, window * mib))
        cases.append((f"pread 12 + {label}", 12, kind, lanes, window * mib))
    got: dict[str, list] = {}
    for r in range(a.repeat):
        for label, preads, kind, lanes, window in cases:
            res = run_case(plain, strided, preads, kind, lanes, window, a.seconds)
            got.setdefault(label, []).append(res)
            print(f"round {r} {label:24s} pread {res['pread_gbps']:6.2f} GB/s  strided payload {res['strided_gbps']:6.2f} GB/s",
                  flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps({"case": label, "round": r, **res}) + "\n")
    print("\nmedians: case -> plain preads GB/s, strided payload GB/s")
    for label, rs in got.items():
        print(f"  {label:24s} {statistics.median(x['pread_gbps'] for x in rs):6.2f}  "
              f"{statistics.median(x['strided_gbps'] for x in rs):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
