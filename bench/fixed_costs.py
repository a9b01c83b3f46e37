"""Each fixed step of a load, timed alone on this host (no GPU needed): what a load pays besides its
reads and copies, step by step.

    python3 bench/fixed_costs.py DATA [--size 15GiB] [--repeat 15] [--json]

The dense checkpoint of `--size` (written under DATA when missing, 4 shards) is compiled with the
`copy` rules, its files read once (page cache warm, as a warm load finds them), then each step timed
`--repeat` times and its median printed in ms: the fingerprints, the check against the files'
headers, the plan's check, opening the files (`allocation.open_reader`: the page-cache check of
`io.direct: auto`), starting the readers' threads and joining them (`open_pool`), the report's
prediction (`Prediction.of`), the live room, and the RSS reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ensure_checkpoint, warm_file, write_spec  # noqa: E402

from planc.base.units import parse_bytes  # noqa: E402


def timed(fn, repeat: int, after=None) -> list[float]:
    """Seconds of each of `repeat` calls of `fn` (`after(result)` run off the clock)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = fn()
        out.append(time.perf_counter() - t0)
        if after is not None:
            after(got)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("--size", default="15GiB")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from planc.compiler.compile import compile_spec
    from planc.execute.device.memory import live_room, reset_hwm, rss_bytes
    from planc.execute.pipeline import run
    from planc.execute.pipeline.allocation import open_pool, open_reader
    from planc.execute.pipeline.records import Prediction
    from planc.plan.codec import checked

    ck = ensure_checkpoint(a.data, "dense", parse_bytes(a.size), 4)
    for f in sorted(ck.glob("*.safetensors")):
        warm_file(f)
    plan = compile_spec(write_spec(ck, "copy"))
    n = a.repeat
    joins: list[float] = []

    def join(pool) -> None:
        t0 = time.perf_counter()
        pool.shutdown(wait=True)
        joins.append(time.perf_counter() - t0)

    steps = {
        "fingerprints": timed(lambda: run.check_fingerprints(plan), n),
        "headers": timed(lambda: run.check_against_headers(plan), n),
        "plan_check": timed(lambda: checked(plan), n),
        "open_files": timed(lambda: open_reader(plan), n, after=lambda r: r.close()),
        "start_readers": timed(lambda: open_pool(plan), n, after=join),
        "prediction": timed(lambda: Prediction.of(plan, 0.5), n),
        "live_room": timed(lambda: live_room(256 << 20), n),
        "rss": timed(rss_bytes, n),
        "reset_hwm": timed(reset_hwm, n),
    }
    steps["join_readers"] = joins
    doc = {"plan": {"parts": len(plan.parts), "runs": len(plan.runs),
                    "requests": sum(len(r.requests) for r in plan.runs), "files": len(plan.checkpoint.files),
                    "workers": plan.io.workers},
           "repeat": n, "median_ms": {k: statistics.median(v) * 1e3 for k, v in steps.items()}}
    if a.json:
        print(json.dumps(doc))
    else:
        p = doc["plan"]
        print(f"{ck.name}: {p['parts']} parts, {p['requests']} requests, {p['files']} files, {p['workers']} readers; "
              f"medians of {n}")
        for k, v in doc["median_ms"].items():
            print(f"  {k:14s} {v:8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
