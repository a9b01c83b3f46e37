"""How long does reading the manifest of a very large checkpoint take? Headers only, so it should
depend on the tensor count, not on the bytes.

    python bench/inspect_sparse.py OUT_DIR [--size 400GiB] [--experts 256] [--layers 120] [--shards 80]

Writes a sparse MoE checkpoint (headers plus holes: no disk used for the data) into OUT_DIR/ckpt
with `planc.tools.synth.write_checkpoint`, then times, each in a fresh process, median of --repeat runs:
* `read_manifest(index)` alone (measured inside the process, imports excluded);
* `planc inspect INDEX --json` end to end (process start to exit, JSON written to a pipe);
* `planc --version` end to end, the start-up cost the line above includes.
The page cache is warm: the headers were just written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planc.tools.synth import write_checkpoint  # noqa: E402
from planc.base.units import fmt_bytes, parse_bytes  # noqa: E402

_READ = """
import json, sys, time
from planc.manifest import read_manifest
t0 = time.perf_counter()
m = read_manifest(sys.argv[1])
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "tensors": len(m.tensors), "shards": len(m.shards),
                  "total_bytes": m.total_bytes, "header_bytes": sum(s.header_bytes for s in m.shards)}))
"""


def _wall(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return dt, r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--size", type=parse_bytes, default=parse_bytes("400GiB"))
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--shards", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)

    ckpt = a.out_dir / "ckpt"
    t0 = time.perf_counter()
    res = write_checkpoint(ckpt, "moe", size_bytes=a.size, layers=a.layers, experts=a.experts,
                           shards=a.shards, sparse=True)
    wrote = time.perf_counter() - t0
    disk = sum(os.stat(f).st_blocks * 512 for f in res.files)
    print(f"checkpoint: {res.path}")
    print(f"  {res.tensors} tensors in {len(res.files)} sparse shards, {fmt_bytes(res.total_bytes)} "
          f"({res.total_bytes} bytes) apparent, {fmt_bytes(disk)} on disk; "
          f"{res.layers} layers x {res.dims.experts} experts, {res.dims.text()}; written in {wrote:.1f} s")

    py = sys.executable
    reads, inspects, starts = [], [], []
    for _ in range(a.repeat):
        _, o = _wall([py, "-c", _READ, res.path])
        doc = json.loads(o)
        reads.append(doc["seconds"])
        dt, o = _wall([py, "-m", "planc", "inspect", res.path, "--json"])
        got = json.loads(o)
        assert got["tensors"] == res.tensors == doc["tensors"], (got["tensors"], res.tensors)
        assert got["total_bytes"] == res.data_bytes, (got["total_bytes"], res.data_bytes)
        inspects.append(dt)
        starts.append(_wall([py, "-m", "planc", "--version"])[0])

    def fig(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.2f} s  (runs: {', '.join(f'{x:.2f}' for x in xs)})"

    print(f"  headers: {fmt_bytes(doc['header_bytes'])} ({doc['header_bytes']} bytes) in {doc['shards']} shards")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"read_manifest(index), in process:     {fig(reads)}")
    print(f"planc inspect --json, fresh process:  {fig(inspects)}")
    print(f"planc --version, fresh process:       {fig(starts)}")
    per = statistics.median(reads) / res.tensors * 1e6
    print(f"read_manifest per tensor: {per:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
