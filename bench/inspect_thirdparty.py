"""Does `planc inspect` report a checkpoint written by someone else the way safetensors reads it?

    python bench/inspect_thirdparty.py FILE.safetensors [--top N]

Three readings of one file are compared, tensor by tensor:
* planc's manifest (`read_manifest`), and `planc inspect FILE --json` / `planc inspect FILE` run
  in a fresh process;
* `safetensors.safe_open(FILE, framework="numpy")`: names, dtypes, shapes, metadata, and each
  tensor's bytes (for the dtypes numpy can hold);
* the raw header (u64 length + JSON), parsed here: `data_offsets` shifted by 8 + header length
  must be planc's `start`/`end`.

Prints the figures and one verdict line per check; exits 0 when all agree, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planc.manifest import read_manifest  # noqa: E402
from planc.base.units import fmt_bytes  # noqa: E402


def raw_header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def planc_cli(path: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "planc", "inspect", str(path), *args],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    if r.returncode != 0:
        raise SystemExit(f"planc inspect exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args(argv)
    path = a.file.resolve()

    from safetensors import safe_open

    m = read_manifest(path)
    mine = {t.name: t for t in m.tensors}
    header_len, header = raw_header(path)
    meta = header.pop("__metadata__", None)
    checks: list[tuple[str, bool, str]] = []

    def check(what: str, ok: bool, detail: str = "") -> None:
        checks.append((what, ok, detail))

    with safe_open(str(path), framework="numpy") as f:
        names = sorted(f.keys())
        theirs = {}
        for n in names:
            s = f.get_slice(n)
            theirs[n] = (s.get_dtype(), tuple(s.get_shape()))
        check("names", names == sorted(mine), f"{len(names)} (safetensors) vs {len(mine)} (planc)")
        bad = sorted(n for n in names if n in mine and theirs[n] != (mine[n].dtype, mine[n].shape))
        check("dtypes and shapes", not bad, f"differ for {bad[:5]}" if bad else "")
        check("metadata", (f.metadata() or {}) == dict(m.shards[0].metadata),
              f"{f.metadata()} vs {dict(m.shards[0].metadata)}")

        # Offsets: planc's absolute [start, end) against the raw header's data_offsets.
        base = 8 + header_len
        off_bad = sorted(n for n, e in header.items()
                         if n not in mine or (mine[n].start, mine[n].end)
                         != (base + e["data_offsets"][0], base + e["data_offsets"][1]))
        check("offsets", not off_bad and len(header) == len(mine),
              f"differ for {off_bad[:5]}" if off_bad else f"data starts at byte {base}")

        # Bytes: what safetensors decodes equals the file's bytes at planc's offsets.
        compared, skipped, byte_bad = 0, [], []
        with open(path, "rb") as raw:
            for n in names:
                try:
                    arr = f.get_tensor(n)
                except Exception:  # noqa: BLE001 - dtypes numpy cannot hold (BF16, FP8)
                    skipped.append(n)
                    continue
                t = mine[n]
                raw.seek(t.start)
                if raw.read(t.nbytes) != arr.astype(arr.dtype.newbyteorder("<")).tobytes():
                    byte_bad.append(n)
                compared += 1
        check("tensor bytes at planc's offsets", not byte_bad,
              f"{compared} compared, {len(skipped)} skipped (dtype numpy lacks)"
              + (f"; differ for {byte_bad[:5]}" if byte_bad else ""))

    # The command line, in a fresh process.
    doc = json.loads(planc_cli(path, "--json", "--top", str(a.top)))
    by_dtype: Counter = Counter()
    count: Counter = Counter()
    for n, (dt, _) in theirs.items():
        info = header[n]
        by_dtype[dt] += info["data_offsets"][1] - info["data_offsets"][0]
        count[dt] += 1
    want_by_dtype = {d: {"tensors": count[d], "bytes": by_dtype[d]} for d in sorted(count)}
    check("inspect --json: tensors", doc["tensors"] == len(names), f"{doc['tensors']} vs {len(names)}")
    check("inspect --json: total_bytes", doc["total_bytes"] == sum(by_dtype.values()),
          f"{doc['total_bytes']} vs {sum(by_dtype.values())}")
    check("inspect --json: by_dtype", doc["by_dtype"] == want_by_dtype, json.dumps(doc["by_dtype"]))
    check("inspect --json: header_bytes", doc["header_bytes"] == header_len, f"{doc['header_bytes']} vs {header_len}")
    check("inspect --json: shard size", doc["shards"][0]["size_bytes"] == path.stat().st_size,
          f"{doc['shards'][0]['size_bytes']} vs {path.stat().st_size}")
    sizes = {n: header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in names}
    want_largest = sorted(names, key=lambda n: (-sizes[n], n))[:a.top]
    got_largest = [(x["name"], x["dtype"], tuple(x["shape"]), x["bytes"]) for x in doc["largest"]]
    check("inspect --json: largest", got_largest == [(n, *theirs[n], sizes[n]) for n in want_largest],
          ", ".join(f"{x[0]} {x[1]} {list(x[2])}" for x in got_largest[:3]) + ", ...")
    text = planc_cli(path)
    first = text.splitlines()[0]
    check("inspect (text): summary line", f"{len(names)} tensors" in first and "1 shard(s)" in first, first)

    print(f"file:     {path}")
    print(f"sha256:   {sha256(path)}")
    print(f"size:     {path.stat().st_size} bytes ({fmt_bytes(path.stat().st_size)}), header {header_len} bytes, "
          f"metadata {meta}")
    print(f"tensors:  {len(names)}, data {sum(by_dtype.values())} bytes, dtypes "
          + ", ".join(f"{d} x{v['tensors']}" for d, v in want_by_dtype.items()))
    width = max(len(w) for w, _, _ in checks)
    for what, ok, detail in checks:
        print(f"{'agree   ' if ok else 'DISAGREE'} {what:<{width}}  {detail}")
    agree = all(ok for _, ok, _ in checks)
    print("verdict:  planc and safetensors agree" if agree else "verdict:  planc and safetensors DISAGREE")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
