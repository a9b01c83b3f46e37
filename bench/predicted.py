"""Predicted against measured, side by side: the plan's wall (warm and cold) and device peak, and
what `planc run` measures (run on the GPU machine).

    python3 bench/predicted.py DATA_DIR OUT_DIR [--cases dense,dense_fp16,fp8,moe] [--modes warm,cold]
                                                [--repeat 3] [--size 15GiB] [--spec SPEC[@RANK] ...]

For each case of bench/peers.py (checkpoints written once, reused) and each cache mode, runs
`planc run SPEC --json` in a fresh process `--repeat` times (page cache warmed by a read first, or
dropped before each cold run) and prints the measured wall beside the plan's prediction for that
mode (`report.predicted`), and the measured device growth (free device memory before and after
allocating) beside the predicted device peak. `--spec` adds specs of your own (a tensor-parallel
one as SPEC@RANK, e.g. a rank alone). One JSON line per load goes to OUT_DIR/predicted.jsonl.
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

from common import drop_page_cache, ensure_checkpoint, planc, write_spec  # noqa: E402
from peers import CASES, warm  # noqa: E402

from planc.base.units import parse_bytes  # noqa: E402


def load(spec: Path, rank: int | None, mode: str, files) -> dict:
    if mode == "warm":
        warm(files)
    elif not drop_page_cache():
        return {"error": "cannot drop the page cache here"}
    args = ["run", spec, "--json"] + (["--rank", rank] if rank is not None else [])
    rc, out, err = planc(*args)
    if rc != 0:
        return {"error": err[-800:]}
    rep = json.loads(out)
    p, d = rep["predicted"], rep["device_memory"]
    return {"wall_s": rep["wall_seconds"], "predicted_s": p[f"wall_{mode}_seconds"],
            "default_costs": p["default_costs"], "device_growth": d["measured_allocated_bytes"],
            "device_predicted": d["predicted_peak_bytes"], "host_growth": rep["host"]["growth_bytes"],
            "host_predicted": rep["host"]["predicted_peak_bytes"]}


def files_of(spec: Path) -> list[str]:
    from planc.manifest import read_manifest
    from planc.spec.model import load_spec

    m = read_manifest(load_spec(spec).checkpoint_path)
    return [str(Path(m.root) / s.path) for s in m.shards]


def report(name: str, mode: str, rows: list[dict], log) -> None:
    ok = [r for r in rows if "error" not in r]
    for r in rows:
        log.write(json.dumps({"case": name, "mode": mode, **r, "time": time.time()}) + "\n")
        if "error" in r:
            print(f"  {name} {mode}: ERROR {r['error']}", flush=True)
    if not ok:
        return
    wall = statistics.median(r["wall_s"] for r in ok)
    pred = ok[0]["predicted_s"]
    dg, dp = ok[0]["device_growth"], ok[0]["device_predicted"]
    dev = f"{dg / 2**30:.3f} / {dp / 2**30:.3f} GiB ({dg / dp:.3f}x)" if dg is not None and dp else "n/a"
    print(f"{name:>24} {mode:>4}: wall {wall:.3f} s measured / {pred:.3f} s predicted ({wall / pred:.2f}x)"
          f"{' [default costs]' if ok[0]['default_costs'] else ''}; device growth / peak {dev}; host growth / peak "
          f"{ok[0]['host_growth'] / 2**30:.3f} / {ok[0]['host_predicted'] / 2**30:.3f} GiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--cases", default="dense,dense_fp16,fp8,moe")
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", default="15GiB")
    ap.add_argument("--spec", action="append", default=[], help="SPEC or SPEC@RANK (repeatable)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / "predicted.jsonl").open("a")
    size = parse_bytes(a.size)
    jobs = []
    for case in [c for c in a.cases.split(",") if c]:
        family, div, rules, _ = CASES[case]
        ck = ensure_checkpoint(a.data, family, size // div, 4)
        jobs.append((case, write_spec(ck, rules, name=f"{ck.name}.{rules}.predicted.yaml"), None))
    for s in a.spec:
        path, _, rank = s.partition("@")
        jobs.append((Path(path).name + (f"@{rank}" if rank else ""), Path(path), int(rank) if rank else None))
    for name, spec, rank in jobs:
        files = files_of(spec)
        for mode in a.modes.split(","):
            report(name, mode, [load(spec, rank, mode, files) for _ in range(a.repeat)], log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
