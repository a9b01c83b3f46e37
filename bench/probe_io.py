"""Where does a warm load spend its time? Raw page-cache read rates into pinned memory, and planc
under several io settings, each in a fresh process (run on the GPU machine).

    python3 bench/probe_io.py DATA_DIR OUT_DIR [--size 15GiB]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ensure_checkpoint, write_spec  # noqa: E402
from peers import one, warm  # noqa: E402

from planc.units import parse_bytes  # noqa: E402


def raw_reads(files, threads: int, chunk: int, pinned: bool) -> float:
    import numpy as np

    if pinned:
        from numba import cuda

        bufs = [cuda.pinned_array(chunk, dtype=np.uint8) for _ in range(threads)]
    else:
        bufs = [np.empty(chunk, dtype=np.uint8) for _ in range(threads)]
    for b in bufs:
        b[::4096] = 1
    jobs = [(f, off) for f in files for off in range(0, os.path.getsize(f), chunk)]
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    lock = threading.Lock()
    it = iter(jobs)
    total = [0]

    def worker(i):
        mv = memoryview(bufs[i])
        while True:
            with lock:
                j = next(it, None)
            if j is None:
                return
            n = os.preadv(fds[j[0]], [mv], j[1])
            with lock:
                total[0] += n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    dt = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return total[0] / dt / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="15GiB")
    ap.add_argument("--configs", default="16:8:64MiB,16:16:32MiB,16:32:16MiB,32:32:16MiB,8:16:64MiB")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ck = ensure_checkpoint(a.data, "dense", parse_bytes(a.size), 4)
    files = sorted(str(p) for p in ck.glob("*.safetensors"))
    warm(files)
    res = {"raw": [], "planc": []}
    for threads in (4, 8, 16):
        for chunk in (16 << 20, 64 << 20):
            for pinned in (False, True):
                gbs = raw_reads(files, threads, chunk, pinned)
                res["raw"].append({"threads": threads, "chunk": chunk, "pinned": pinned, "gb_per_s": gbs})
                print(f"raw preadv threads={threads:2d} chunk={chunk >> 20:3d}MiB pinned={pinned}: {gbs:6.2f} GB/s",
                      flush=True)
    for cfg in a.configs.split(","):
        w, n, slot = cfg.split(":")
        spec = write_spec(ck, "copy", workers=int(w), slots=int(n), slot=slot, name=f"probe.{w}.{n}.{slot}.yaml")
        warm(files)
        r = one("planc", ck, spec)
        res["planc"].append({"config": cfg, **r})
        if "error" in r:
            print(f"planc {cfg}: ERROR {r['error'][-800:]}", flush=True)
        else:
            print(f"planc workers={w} slots={n} slot={slot}: {r['gb_per_s']:.2f} GB/s wall {r['wall_seconds']:.2f}s "
                  f"growth {(r['hwm_bytes'] - r['baseline_rss_bytes']) / 2**20:.0f} MiB {r.get('timings')}", flush=True)
    (a.out / "probe_io.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
