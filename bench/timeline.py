"""Where one load's wall time goes: a timeline of its steps, thread by thread (run on the GPU machine).

    python3 bench/timeline.py PLAN OUT [--repeat 3] [--pin register,alloc] [--loads 2] [--touch GiB]

Each run is a fresh process that makes its CUDA context and reads the plan first (not timed), then
loads it `--loads` times in a row with every step of the pipeline timed by the load's own events
(`planc.execute.pipeline.events`, given to `execute(observer=...)`; nothing is wrapped): pinning each ring
slot (`pin`), the device allocations (`device_alloc`), each read, each request's copies (`copy`),
each run's kernels, the waits on slot events (`slot_wait`) and the other timed waits, the final synchronize (`stream_sync`),
the allocation, run and release phases (`allocate`, `run`, `free`). Prints, per load, when each phase starts and ends relative to the start of
`execute()`, and writes OUT/timeline.jsonl (one line per load, with every event).

`PLANC_BENCH_LANES=N` in the environment sets the ring's pinning lanes (`ring.Pinner.LANES`) in the
loading processes, for this bench only; `PLANC_BENCH_SWITCH=S` the interpreter's switch interval
(the mapped reads' window and lanes are the plan's: `io.map_window`, `io.map_lanes`). Strided reads
also record their waits for a mapping lane (`lane_wait`: the load's reader is a subclass that times
its lanes, passed in as the reader part).

`--touch N`: after the rounds, a separate process writes N GiB of anonymous memory once and exits,
then the rounds run again (`touched` in each line). A virtual machine whose memory the host backs
on first use (the lent machines: Firecracker, memory growing as it is used) makes a process's first
touch of guest memory no one used before slower than on a machine whose memory was used; pinning
the ring is such a first touch. The two sets of rounds measure how much of the pinning that is.
Each load also records the kernel's counters over it (/proc/vmstat: huge pages made at a fault or
refused, compaction stalls, page faults): a ring that fell back to small pages, or waited for
compaction, shows there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(plan_path: str, loads: int) -> list[dict]:
    import planc.execute
    from planc.execute.pipeline import allocation, events as ev
    from planc.execute.io import reader, ring
    from planc.execute.device import seam
    from planc.execute.pipeline.parts import Parts
    from planc.plan.codec import load_plan

    seam.select("cuda:0")
    if os.environ.get("PLANC_BENCH_LANES"):  # this bench's variant only: the ring's pinning lanes
        ring.Pinner.LANES = int(os.environ["PLANC_BENCH_LANES"])
    if os.environ.get("PLANC_BENCH_SWITCH"):  # the interpreter's GIL switch interval, seconds
        sys.setswitchinterval(float(os.environ["PLANC_BENCH_SWITCH"]))
    plan = load_plan(plan_path)
    events: list = []
    t_zero = [0.0]

    class Lanes:  # the mapping lanes' semaphore, with the time each strided window waits for one
        def __init__(self, inner):
            self.inner = inner

        def __enter__(self):
            t0 = time.perf_counter()
            self.inner.acquire()
            events.append(("lane_wait", threading.current_thread().name, t0 - t_zero[0],
                           time.perf_counter() - t_zero[0]))

        def __exit__(self, *exc):
            self.inner.release()

    class LaneTimedReader(reader.Reader):  # the load's reader, its mapping lanes timed (a part, passed in)
        def __post_init__(self):
            super().__post_init__()
            self._lanes = Lanes(self._lanes)

    def observe(e) -> None:  # the load's events (planc.execute.pipeline.events): one line each, as the steps ran
        nbytes, key = 0, (None, None)
        if isinstance(e, ev.ReadDone):
            what, nbytes, key = ("read_strided" if e.strided else "read"), e.nbytes, (e.run, e.request)
        elif isinstance(e, ev.CopyIssued):
            what, key = "copy", (e.run, e.request)
        elif isinstance(e, ev.KernelsLaunched):
            what = "kernels"
        elif isinstance(e, ev.Step):
            what = {"final_sync": "stream_sync"}.get(e.name, e.name)
        elif isinstance(e, ev.Timed):
            what = e.name  # wait_reads, wait_pin, ...
        else:
            return
        events.append((what, e.thread, e.start - t_zero[0], e.end - t_zero[0], nbytes, *key))

    parts = Parts(reader=lambda p: allocation.open_reader(p, LaneTimedReader))
    out = []
    for k in range(loads):
        events.clear()
        vm0 = vmstat()
        t_zero[0] = time.perf_counter()
        model = planc.execute.execute(plan, observer=observe, parts=parts)
        t_end = time.perf_counter() - t_zero[0]
        vm = {key: v - vm0.get(key, 0) for key, v in vmstat().items()}
        rep = model.report
        model.free()
        out.append({"load": k, "execute_s": t_end, "wall_seconds": rep["wall_seconds"], "vmstat": vm,
                    "timings": dict(rep["timings"]), "payload_bytes": rep["payload_bytes"],
                    "growth_over_predicted": rep["host"]["growth_bytes"] / rep["host"]["predicted_peak_bytes"],
                    "events": list(events)})
    seam.settle_released()
    return out


VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "compact_fail", "pgfault", "pgmajfault")


def vmstat() -> dict:
    """The kernel's counters of huge pages made or refused at a fault (the ring's populating), of
    compaction stalls and of page faults, from /proc/vmstat (machine-wide)."""
    try:
        lines = Path("/proc/vmstat").read_text().split("\n")
    except OSError:
        return {}
    got = dict(line.split(" ", 1) for line in lines if line.split(" ", 1)[0] in VMSTAT)
    return {k: int(v) for k, v in got.items()}


def touch(gib: float) -> int:
    """Write `gib` GiB of anonymous memory once (one byte per page), then exit."""
    import mmap

    n = int(gib * (1 << 30))
    m = mmap.mmap(-1, n)
    try:
        m.madvise(23)  # MADV_POPULATE_WRITE: the kernel writes every page
    except (OSError, ValueError):
        for off in range(0, n, 4096):
            m[off] = 1
    m.close()
    return 0


def summarize(ev: list) -> dict:
    """Per step: how many, first start, last end, thread-seconds busy; for reads (plain and strided)
    also their bytes and GB/s per busy thread-second, which falls when readers contend."""
    by: dict[str, list] = {}
    for name, thread, a, b, *rest in ev:
        by.setdefault(name, []).append((a, b, thread, rest[0] if rest else 0))
    s = {}
    for name, xs in by.items():
        s[name] = {"n": len(xs), "first_start": min(a for a, *_ in xs), "last_end": max(b for _, b, *_ in xs),
                   "busy": sum(b - a for a, b, *_ in xs)}
        nbytes = sum(x[3] for x in xs)
        if nbytes:
            s[name]["bytes"] = nbytes
            s[name]["gbps_per_thread"] = nbytes / max(s[name]["busy"], 1e-9) / 1e9
    return s


def issue_lag(ev: list) -> dict:
    """How long each read's bytes waited in their slot for their copies to be issued: the copy's start
    less the read's end, per request (events of this bench since the requests were named in them).
    The reference pipeline issues a copy as its read completes; a loading thread busy elsewhere (waiting
    for a slot, launching kernels) makes them wait, and the slot with them."""
    ends, lags = {}, []
    for name, _thread, a, b, *rest in ev:
        if name in ("read", "read_strided") and len(rest) >= 3:
            ends[(rest[1], rest[2])] = b
    for name, _thread, a, b, *rest in ev:
        if name == "copy" and len(rest) >= 3 and (rest[1], rest[2]) in ends:
            lags.append(max(0.0, a - ends[(rest[1], rest[2])]))
    if not lags:
        return {}
    lags.sort()
    return {"n": len(lags), "median_ms": statistics.median(lags) * 1e3, "p90_ms": lags[int(0.9 * (len(lags) - 1))] * 1e3,
            "max_ms": lags[-1] * 1e3, "total_s": sum(lags)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loads", type=int, default=2)
    ap.add_argument("--pin", default="register,alloc")
    ap.add_argument("--touch", type=float, default=0.0, help="GiB of memory written once between two sets of rounds")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--touch-child", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]))))
        return 0
    if a.touch_child:
        return touch(a.touch_child)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict = {}
    rounds = [(False, k) for k in range(a.repeat)]
    if a.touch:
        rounds += [(True, k) for k in range(a.repeat)]
    for touched, k in rounds:
        if touched and k == 0:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--touch-child", str(a.touch)], check=True, timeout=600)
            print(f"touched {a.touch:g} GiB in {time.perf_counter() - t0:.2f} s", flush=True)
        for pin in a.pin.split(","):
            env = dict(os.environ, PLANC_PIN=pin)
            p = subprocess.run([sys.executable, __file__, "--child", a.plan, str(a.loads)], capture_output=True,
                               text=True, env=env, cwd=ROOT, timeout=600)
            if p.returncode:
                print(f"pin={pin}: exited {p.returncode}\n{p.stderr[-3000:]}")
                continue
            for r in json.loads(p.stdout.strip().splitlines()[-1]):
                r["pin"], r["touched"] = pin, touched
                with open(out / "timeline.jsonl", "a") as f:
                    f.write(json.dumps(r) + "\n")
                sm = summarize(r["events"])
                rows.setdefault((pin + ("+touched" if touched else ""), r["load"]), []).append((r, sm))
                brief = {k: f"{v['first_start']:.3f}-{v['last_end']:.3f} busy {v['busy']:.3f} n={v['n']}" + (
                    f" {v['bytes'] / 1e9:.3f} GB, {v['gbps_per_thread']:.2f} GB/s per thread" if "bytes" in v else "")
                         for k, v in sorted(sm.items(), key=lambda kv: kv[1]["first_start"])}
                print(f"pin={pin}{' touched' if touched else ''} load {r['load']}: execute {r['execute_s']:.3f} wall {r['wall_seconds']:.3f} "
                      f"growth/pred {r['growth_over_predicted']:.3f} vmstat {r.get('vmstat')}", flush=True)
                for k, v in brief.items():
                    print(f"    {k:14s} {v}")
                lag = issue_lag(r["events"])
                if lag:
                    print(f"    {'issue lag':14s} read done -> copy issued: median {lag['median_ms']:.2f} ms, p90 "
                          f"{lag['p90_ms']:.2f}, max {lag['max_ms']:.2f}, {lag['total_s']:.3f} s over {lag['n']} requests")
    print("\nmedians: pin, load -> execute s, wall s, GB/s")
    for (pin, k), xs in sorted(rows.items()):
        ex = statistics.median(r["execute_s"] for r, _ in xs)
        wall = statistics.median(r["wall_seconds"] for r, _ in xs)
        print(f"  {pin:17s} load {k}: execute {ex:.3f}  wall {wall:.3f}  {xs[0][0]['payload_bytes'] / wall / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
