"""`planc probe`'s figures with its destination buffers written before the timing (as a load's ring
slots are) against fresh ones (faulted in and zeroed by the timed reads), alternated in one process,
each variant's probe file kept for `planc explain` to predict with (docs/tp.md).

    python3 bench/probe_buffers.py FOLDER OUT [--size 1GiB] [--workers 16] [--rounds 2]
"""

import argparse
import mmap
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planc.base.units import parse_bytes  # noqa: E402
from planc.tools import probe  # noqa: E402

KEYS = ("page_s", "copy_byte_s", "read_byte_s", "request_s", "mapped_small_gbps", "mapped_large_gbps", "rows_gbps")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="1GiB", type=parse_bytes)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    written = probe._buffers
    # fresh: page-aligned (O_DIRECT reads need it) but never written, so the timed reads fault them in
    variants = {"written": written, "fresh": lambda n, size: [np.frombuffer(mmap.mmap(-1, size), np.uint8) for _ in range(n)]}
    docs = {k: [] for k in variants}
    for rnd in range(a.rounds):
        for k in (list(variants) if rnd % 2 == 0 else list(variants)[::-1]):
            probe._buffers = variants[k]
            try:
                docs[k].append(probe.measure(a.folder, a.size, a.workers, a.repeat))
            finally:
                probe._buffers = written
    summary = {}
    for k, ds in docs.items():
        summary[k] = {st: {f: statistics.median(d[st][f] for d in ds) for f in KEYS} for st in ("warm", "cold")}
        doc = dict(ds[-1])
        for f in ("page_s", "copy_byte_s", "read_byte_s", "request_s"):
            doc[f] = summary[k]["warm"][f]
        doc["warm"] = {**doc["warm"], **summary[k]["warm"]}
        probe.save(doc, a.out / f"probe-{k}.json")
    print(json.dumps(summary, indent=1))
    (a.out / "probe_buffers.json").write_text(json.dumps({"summary": summary, "runs": docs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
