"""The kept ring's loads checked on the GPU: predicted against issued, host growth against the plan,
`--verify` bit-exact, and the readers' threads kept (run on the GPU machine).

    python3 bench/kept_check.py DATA_DIR OUT_DIR [--size 2GiB] [--loads 3]

For each case, in this process: `planc.warm_up(spec)` (the ring pinned and the readers' threads
started, both kept), then `--loads` loads of the same Plan with `verify=True`, each freed before the
next. Every load's requests, copies and kernels must equal the plan's, its host growth (which counts
the kept ring: `host.kept_ring_bytes`) stand within 5 % of the plan's host peak, its bytes match the
files, and no readers' thread be started or ended by it. Exit 1 when any does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ensure_checkpoint, write_spec  # noqa: E402

from planc.base.units import parse_bytes  # noqa: E402


def _readers() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("planc-read")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--cases", default="dense:copy,dense:fp16,fp8:fp8")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import planc

    size = parse_bytes(a.size)
    results, ok = [], True
    for case in a.cases.split(","):
        fam, rules = case.split(":")
        spec = write_spec(ensure_checkpoint(a.data, fam, size, 4), rules)
        plan = planc.warm_up(spec)
        kept = _readers()
        for i in range(a.loads):
            t0 = time.perf_counter()
            m = planc.load(plan, verify=True)
            took = time.perf_counter() - t0
            r = m.report.as_json()
            m.free()
            h = r["host"]
            ratio = h["growth_bytes"] / max(1, h["predicted_peak_bytes"])
            counts = all(r[k]["predicted"] == r[k]["issued"] for k in ("requests", "copies", "kernels"))
            same = _readers() == kept
            good = counts and r["verify"]["ok"] and ratio <= 1.05 and same and h["kept_ring_bytes"] > 0
            ok &= good
            print(f"{case} load {i}: {'ok' if good else 'FAIL'} {r['gb_per_s']:.2f} GB/s (call {took:.3f} s) "
                  f"verify={r['verify']['ok']} req {r['requests']} copies {r['copies']} kernels {r['kernels']} "
                  f"host growth {h['growth_bytes'] / 2**20:.1f} MiB / predicted {h['predicted_peak_bytes'] / 2**20:.1f} "
                  f"MiB = {ratio:.3f} (kept ring {h['kept_ring_bytes'] / 2**20:.0f} MiB) readers kept={same}",
                  flush=True)
            results.append({"case": case, "load": i, "ok": good, "call_seconds": took, "report": r})
        planc.release_ring()
    (a.out / "kept_check.json").write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
