"""Read-and-hash throughput on the host alone (no GPU, no pipeline): `--threads` readers read a
checkpoint's files (warm in the page cache) in 16 MiB requests into buffers of their own, each
request read and hashed one way per mode, the modes alternated round by round:

- `plain`: one `preadv` per request (what a plain load's readers do);
- `python`: `preadv` then xxh3-128 of the request from Python (the Python hasher, leaf-sized pieces);
- `native`: the read-and-hash loop (`planc.execute.io.readhash`) at `--piece` bytes per read;
- `native-nohash`: the same loop hashing nothing (its reads alone).

`--dma` runs a cupy copy of pinned host memory to the GPU beside the modes (the copy engine's
traffic a load adds: docs/reload.md), where cupy and a GPU are present.

    python3 bench/readhash_cpu.py DIR [--threads 16] [--piece 256KiB] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planc.base.units import parse_bytes  # noqa: E402
from planc.execute.io import readhash  # noqa: E402

REQ = 16 << 20


def _jobs(root: Path) -> list:
    files = sorted(p for p in root.iterdir() if p.suffix == ".safetensors")
    out = []
    for p in files:
        size = p.stat().st_size
        out += [(str(p), off, min(REQ, size - off)) for off in range(0, size, REQ)]
    return out


def run(mode: str, jobs: list, threads: int, piece: int) -> dict:
    import xxhash

    rh = readhash.load()
    fds = {p: os.open(p, os.O_RDONLY) for p in {j[0] for j in jobs}}
    busy = [0.0] * threads

    def work(t):
        buf = np.zeros(REQ, np.uint8)
        mv = memoryview(buf)
        t0 = time.perf_counter()
        for path, off, n in jobs[t::threads]:
            fd = fds[path]
            if mode == "plain":
                os.preadv(fd, [mv[:n]], off)
            elif mode == "python":
                os.preadv(fd, [mv[:n]], off)
                h = xxhash.xxh3_128()
                h.update(mv[:n])
                h.digest()
            else:  # native, native-nohash, native-LEVEL (readhash.LEVELS)
                level = mode.split("-", 1)[1] if "-" in mode and mode != "native-nohash" else None
                got, _ = rh.read(fd, buf, off, n, n, piece, False, [] if mode == "native-nohash" else [(0, n)], level)
                assert got == n
        busy[t] = time.perf_counter() - t0

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    total = sum(j[2] for j in jobs)
    return {"gb_per_s": total / wall / 1e9, "wall_s": wall, "thread_s": sum(busy)}


class _Dma:
    """The copy engine reading pinned host memory until `stop()` (its GB/s)."""

    def __init__(self, n: int = 1 << 30):
        import cupy as cp

        self.cp, self.n, self.done, self.moved = cp, n, threading.Event(), 0
        self.host, self.dev = cp.cuda.alloc_pinned_memory(n), cp.cuda.alloc(n)
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rt = self.cp.cuda.runtime
        stream = self.cp.cuda.Stream(non_blocking=True)
        with stream:
            while not self.done.is_set():
                rt.memcpyAsync(self.dev.ptr, self.host.ptr, self.n, rt.memcpyHostToDevice, stream.ptr)
                stream.synchronize()
                self.moved += self.n

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.moved / (time.perf_counter() - self.t0) / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--piece", default="256KiB", type=parse_bytes)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="plain,python,native-scalar,native,native-nohash",
                   help="plain, python, native (the loop at its widest level), native-nohash, native-LEVEL "
                        "(a level of planc.execute.io.readhash.LEVELS: scalar, avx2, avx512)")
    p.add_argument("--json", type=Path)
    p.add_argument("--dma", action="store_true", help="a cupy copy of 1 GiB of pinned memory to the GPU, over and "
                   "over, beside the modes")
    a = p.parse_args(argv)
    jobs = _jobs(a.root)
    modes = a.modes.split(",")
    for path in {j[0] for j in jobs}:  # warm the page cache
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass
    rows = {m: [] for m in modes}
    dma = _Dma() if a.dma else None
    try:
        for rnd in range(a.rounds):
            for m in (modes if rnd % 2 == 0 else modes[::-1]):
                rows[m].append(run(m, jobs, a.threads, a.piece))
    finally:
        dma_gbps = dma.stop() if dma else None
    med = {m: statistics.median(r["gb_per_s"] for r in v) for m, v in rows.items()}
    doc = {"threads": a.threads, "piece_bytes": a.piece, "dma_gb_per_s": dma_gbps, "median_gb_per_s": med,
           "over_plain": {m: med[m] / med["plain"] for m in med} if "plain" in med else None, "rounds": rows}
    print(json.dumps({k: doc[k] for k in ("threads", "piece_bytes", "dma_gb_per_s", "median_gb_per_s", "over_plain")},
                     indent=1))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
