"""The host side of a digest-verified load, on the CPU alone: what verification costs, and where.

    python3 bench/digest_cpu.py DATA OUT [--size 2GiB] [--shards 4] [--workers 2] [--repeats 5]

Writes the dense checkpoint (`planc synth --family dense`, once under DATA), compiles the `copy`
spec of bench/reload.py (16 MiB slots, `--workers` readers), writes its digest and warms the page
cache. Then it replays the plan's requests as the pipeline issues them (plan order, a pool of
`--workers` threads, each request into its ring slot, a slot reused only once its previous read
is done) through the real `planc.execute.io.reader.Reader`, with no device:

- `plain`: the reader alone;
- `digest`: the reader wrapped as `planc.execute` wraps it for `verify="digest"`
  (`DigestReader` + `Verifier`, `finish()` included);
- `read_hash_after`: each request read whole, then its slot hashed with xxh3-128 (the slot is no
  longer in the caches: the hash's own pass over memory);
- `read_hash_pieces`: each request read and hashed piece by piece (`--piece`, 1 MiB), each piece
  while it is in the cache; `read_pieces`: read piece by piece, not hashed (what the pieces'
  own `preadv` calls cost).

Each round runs every mode once, the order rotated round by round; the first round is a warm-up,
reported apart; medians of `--repeats` rounds, and each mode's ratio to `plain` of the same round.
`digest` also reports the time its threads spent in the reader, in the verifier, and what the
verifier's summary says (hashing and waiting, where it counts them). With `--alignment` only: how
the plan's requests fall on the digest's extents.

Results: OUT/digest_cpu.json (also printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import ensure_checkpoint, write_spec  # noqa: E402


def _args(argv=None):
    from planc.base.units import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="2GiB", type=parse_bytes)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--piece", default="1MiB", type=parse_bytes)
    p.add_argument("--modes", default="plain,digest,read_hash_after,read_hash_pieces")
    return p.parse_args(argv)


def alignment(plan, extent: int) -> dict:
    """How the plan's requests fall on extents of `extent` bytes."""
    reqs = [q for r in plan.runs for q in r.requests]
    first_started_before = straddle = 0
    starts = {}
    for q in reqs:
        lo, hi = q.offset, q.offset + q.needed
        straddle += lo // extent != (hi - 1) // extent
        first_started_before += lo % extent != 0
        starts[lo % extent] = starts.get(lo % extent, 0) + 1
    common = sorted(starts.items(), key=lambda kv: -kv[1])[:3]
    return {"requests": len(reqs), "extent_bytes": extent, "straddling_two_extents": straddle,
            "starting_inside_an_extent": first_started_before,
            "most_common_offset_in_extent": [{"offset": o, "requests": n} for o, n in common],
            "host_parts": sum(len(r.host_parts) for r in plan.runs),
            "strided": sum(1 for q in reqs if q.stride)}


class _Timed:
    """The reader with the time its calls take, summed over threads (to split a digest read's time
    into the read's and the verifier's)."""

    def __init__(self, reader):
        self._r, self.seconds, self._lock = reader, 0.0, threading.Lock()

    def __getattr__(self, name):
        return getattr(self._r, name)

    # the reader's own signature: `DigestReader` hands its pieces to a reader whose read_into takes `sink`
    def read_into(self, rel, offset, length, buf, needed, *, sink=None, piece=0, tail=0):
        t = time.perf_counter()
        try:
            return self._r.read_into(rel, offset, length, buf, needed, sink=sink, piece=piece, tail=tail)
        finally:
            with self._lock:
                self.seconds += time.perf_counter() - t


def _replay(plan, ring, read, workers: int) -> float:
    """Every request of `plan` through `read(slot, request)` on `workers` threads, as the pipeline
    issues them; the wall seconds."""
    slots = len(ring)
    busy = [None] * slots
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        i = 0
        for r in plan.runs:
            for q in r.requests:
                s = i % slots
                if busy[s] is not None:
                    busy[s].result()
                busy[s] = pool.submit(read, ring[s], q)
                i += 1
        for f in busy:
            if f is not None:
                f.result()
    return time.perf_counter() - t0


def run_mode(mode: str, plan, digest, ring, workers: int, piece: int) -> dict:
    import os

    import xxhash

    from planc.execute.io.reader import Reader

    reader = Reader(plan.checkpoint.root, "off", map_window=plan.io.map_window_bytes, map_lanes=plan.io.map_lanes)
    for f in plan.checkpoint.files:
        reader.open(f.path, f.size_bytes)
    extra = {}
    try:
        if mode == "plain":
            wall = _replay(plan, ring, lambda b, q: reader.read_into(q.file, q.offset, q.length, b, q.needed), workers)
        elif mode == "digest":
            from planc.execute.io.digestread import DigestReader
            from planc.manifest.digestcheck import Verifier

            timed = _Timed(reader)
            v = Verifier(plan, digest)
            v.check_files()
            dr = DigestReader(timed, v)
            spent = [0.0]
            lock = threading.Lock()

            def read(b, q):
                t = time.perf_counter()
                dr.read_into(q.file, q.offset, q.length, b, q.needed)
                with lock:
                    spent[0] += time.perf_counter() - t

            t0 = time.perf_counter()
            wall = _replay(plan, ring, read, workers)
            t1 = time.perf_counter()
            summary = v.finish()
            wall += time.perf_counter() - t1
            extra = {"finish_s": time.perf_counter() - t1, "thread_s": spent[0], "reader_s": timed.seconds,
                     "verifier_s": spent[0] - timed.seconds, "summary": summary, "replay_s": t1 - t0}
        elif mode in ("read_hash_after", "read_hash_pieces", "read_pieces"):
            after, hashing = mode == "read_hash_after", mode != "read_pieces"

            def read(b, q):
                fd = reader.files[q.file].fd
                mv = memoryview(b)
                if after:
                    got = os.preadv(fd, [mv[:q.needed]], q.offset)
                    xxhash.xxh3_128_digest(mv[:got])
                else:
                    at = 0
                    while at < q.needed:
                        n = min(piece, q.needed - at)
                        got = os.preadv(fd, [mv[at:at + n]], q.offset + at)
                        if hashing:
                            xxhash.xxh3_128_digest(mv[at:at + got])
                        at += got

            wall = _replay(plan, ring, read, workers)
        else:
            raise SystemExit(f"unknown mode {mode}")
    finally:
        reader.close()
    return {"wall_s": wall, "gb_per_s": plan.totals.payload_bytes / wall / 1e9, **extra}


def main(argv=None) -> int:
    import numpy as np

    from planc.compiler.compile import compile_spec
    from planc.manifest import digest as dg
    from planc.manifest import digestcheck as dgc

    args = _args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = ensure_checkpoint(args.data, "dense", args.size, args.shards)
    plan = compile_spec(write_spec(ckpt, "copy", workers=args.workers, name=f"{ckpt.name}.digest-cpu.yaml"))
    path = args.data / f"{ckpt.name}.planc-digest.json"
    t0 = time.perf_counter()
    doc = dg.make_digest(ckpt, workers=args.shards)
    made = time.perf_counter() - t0
    path.write_bytes(dg.encode(doc))
    digest = dg.read_digest(path)
    for f in plan.checkpoint.files:  # warm the page cache
        with open(Path(plan.checkpoint.root) / f.path, "rb") as fh:
            while fh.read(64 << 20):
                pass
    ring = np.empty((plan.io.slots, plan.io.slot_bytes), np.uint8)
    ring[:] = 0  # the ring's pages are resident, as pinned memory's are
    modes = args.modes.split(",")
    res = {"size_bytes": args.size, "payload_bytes": plan.totals.payload_bytes, "workers": args.workers,
           "slot_bytes": plan.io.slot_bytes, "slots": plan.io.slots, "piece_bytes": args.piece,
           "digest_seconds": made, "digest_gb_per_s": sum(f["size_bytes"] for f in doc["files"]) / made / 1e9,
           "alignment": alignment(plan, digest.extent_bytes), "coverage": dgc.coverage(plan, digest.extent_bytes, getattr(digest, "leaf_bytes", None)),
           "first": {}, "rounds": []}
    for rnd in range(args.repeats + 1):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        row = {m: run_mode(m, plan, digest, ring, args.workers, args.piece) for m in order}
        if rnd == 0:
            res["first"] = row
        else:
            res["rounds"].append(row)
    med = {m: statistics.median(r[m]["gb_per_s"] for r in res["rounds"]) for m in modes}
    ratios = {m: statistics.median(r[m]["gb_per_s"] / r["plain"]["gb_per_s"] for r in res["rounds"])
              for m in modes if m != "plain" and "plain" in modes}
    res["median_gb_per_s"] = med
    res["median_ratio_to_plain"] = ratios
    if "digest" in modes:
        res["digest_median"] = {k: statistics.median(r["digest"][k] for r in res["rounds"])
                                for k in ("thread_s", "reader_s", "verifier_s", "finish_s")}
        res["digest_summary"] = res["rounds"][-1]["digest"]["summary"]
    (args.out / "digest_cpu.json").write_text(json.dumps(res, indent=2, default=str))
    print(json.dumps({k: v for k, v in res.items() if k not in ("rounds", "first")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
