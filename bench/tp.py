"""Tensor-parallel loads on one GPU: one rank alone, and all ranks at once, against the whole load.

    python3 bench/tp.py DATA_DIR OUT_DIR [--cases whole,alone,all] [--tp 2,4,8] [--group-tp 8]
                                         [--modes warm,cold] [--repeat 3] [--size 15GiB] [--no-verify]

Writes the Llama-3-8B-shaped bf16 checkpoint once (4 shards, bench/common.ensure_checkpoint), a
spec per tensor-parallel size (docs/tp.md's Llama spec: q/k/v and gate/up fused per rank, o_proj
and down_proj row parallel; io as bench/common.write_spec), and compiles the plans it needs. Cases:

- `whole`: the TP 1 plan, the reference;
- `alone`: rank 0 of each `--tp` size, by itself;
- `all`: every rank of `--group-tp`, one process each, all at once on the one GPU;
- `sharded`: for each `--tp` size, rank 0's bytes written once as a checkpoint of their own (each
  tensor's rank-0 slice, contiguous, in the same 4 shards), loaded whole (TP 1 plan): what the same
  bytes cost when they lie in a file made for the rank, as a pre-sharded checkpoint has them. It is
  the ceiling of `alone`: no read path that takes a rank's bytes out of the whole checkpoint can be
  faster than reading them from such a file, so `alone / sharded` is what the read path itself
  costs, and `sharded / whole` what a load of that size costs whatever it reads.

Every load runs in a fresh process that reads its plan, creates its CUDA context and imports the
executor's modules (which `execute()` would import on its first call), then waits at a file
barrier; the parent reads /proc/diskstats and releases the barrier, so process start and context
creation are outside the load. A process times `execute()` with `time.time()`; a group's
load wall is the latest end minus the earliest start, its process wall from the first spawn to the
last exit. Warm runs read every file into the page cache first; cold runs drop it first (when this
machine cannot, they are skipped and the output says so). `--repeat` runs per case and mode; one
more with `--verify` (bit-exact) per case, not timed. One JSON line per process and one per group
go to OUT_DIR/tp.jsonl; the summary and the targets are printed at the end and written to
OUT_DIR/tp_summary.json:

- one rank alone, warm: GB/s >= 0.8x the whole load's;
- all ranks at once, warm: load wall <= 1.5x the whole load's;
- cold: bytes read from the disk (whole-disk devices) <= 1.1x the checkpoint's, for loads of the
  whole model (the whole load, all ranks at once);
- every load: host growth within 5% of predicted; requests and copies issued equal to the plan's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ALONE_GBS_MIN = 0.8  # one rank alone, warm GB/s / whole load's
GROUP_WALL_MAX = 1.5  # all ranks at once, warm load wall / whole load's
COLD_DISK_MAX = 1.1  # disk bytes read / checkpoint bytes, cold
HOST_GROWTH_TOL = 0.05  # |growth / predicted - 1|
PREDICTED_TOL = 0.2  # |measured load wall / the plans' predicted wall - 1|
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own
BARRIER_TIMEOUT = 300.0

RULES = [
    {"match": "model.layers.{L}.self_attn.{P}.weight", "split": {"dim": 0},
     "fuse": {"into": "model.layers.{L}.self_attn.qkv_proj.weight", "over": "P",
              "order": ["q_proj", "k_proj", "v_proj"]}},
    {"match": "model.layers.*.self_attn.o_proj.weight", "split": {"dim": 1}},
    {"match": "model.layers.{L}.mlp.{P}.weight", "split": {"dim": 0},
     "fuse": {"into": "model.layers.{L}.mlp.gate_up_proj.weight", "over": "P", "order": ["gate_proj", "up_proj"]}},
    {"match": "model.layers.*.mlp.down_proj.weight", "split": {"dim": 1}},
    {"match": "model.embed_tokens.weight", "split": {"dim": 0}},
    {"match": "lm_head.weight", "split": {"dim": 0}},
    {"match": "*"},
]
IO = {"workers": 16, "slot": "16MiB", "slots": 16, "run": "1GiB", "direct": "auto"}  # as common.write_spec


# --------------------------------------------------------------------------- /proc/diskstats


def parse_diskstats(text: str) -> dict[str, int]:
    """Sectors read per device: the 6th field of each line (major, minor, name, reads, merged, sectors, ...)."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6 and f[3].isdigit():
            out[f[2]] = int(f[5])
    return out


def whole_disks(names, sys_block: Path = Path("/sys/block")) -> list[str]:
    """The devices whose reads reach hardware once: whole disks, not partitions nor stacked devices.

    A partition's reads are also its disk's, and device-mapper, md, loop and zram devices pass
    theirs on to (or never reach) a disk, so summing any of them would count bytes twice or not
    at all. Whole disks are the entries of /sys/block; of those, virtual kinds are left out.
    """
    skip = ("loop", "ram", "zram", "dm-", "md", "sr", "nbd", "fd")
    if sys_block.is_dir():
        names = [n for n in names if (sys_block / n).exists()]
    return sorted(n for n in names if not n.startswith(skip))


def disk_read_bytes(before: dict[str, int], after: dict[str, int], disks) -> int:
    return sum(max(0, after.get(d, 0) - before.get(d, 0)) for d in disks) * SECTOR


def diskstats() -> dict[str, int]:
    try:
        return parse_diskstats(Path("/proc/diskstats").read_text())
    except OSError:
        return {}


# --------------------------------------------------------------------------- pre-sharded checkpoints

# The dim each tensor of the Llama spec is split on (RULES), by the name's part before ".weight".
SPLIT_DIM = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0, "embed_tokens": 0, "lm_head": 0,
             "o_proj": 1, "down_proj": 1}
CHUNK = 64 << 20  # bytes of a slice copied at a time while writing


def split_dim(name: str) -> int | None:
    """The dim RULES split `name` on, or None (replicated): RULES split weights only."""
    parts = name.split(".")
    return SPLIT_DIM.get(parts[-2]) if len(parts) >= 2 and parts[-1] == "weight" else None


def rank_slice(arr, dim: int | None, tp: int, rank: int):
    """Rank `rank`'s part of `arr` (an even split on `dim`), or all of it when `dim` is None."""
    if dim is None:
        return arr
    if arr.shape[dim] % tp:
        raise ValueError(f"dim {dim} of {arr.shape} does not split evenly {tp} ways")
    k = arr.shape[dim] // tp
    return arr[rank * k:(rank + 1) * k] if dim == 0 else arr[:, rank * k:(rank + 1) * k]


def _chunks(arr):
    """`arr` as contiguous bytes, CHUNK at a time along dim 0."""
    import numpy as np

    if arr.ndim == 0 or arr.shape[0] == 0:
        yield np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        return
    rows = max(1, CHUNK // max(1, arr[0].nbytes))
    for i in range(0, arr.shape[0], rows):
        yield np.ascontiguousarray(arr[i:i + rows]).reshape(-1).view(np.uint8)


def write_presharded(ckpt: Path, data: Path, tp: int, rank: int = 0) -> Path:
    """Rank `rank`'s bytes under RULES as a checkpoint of their own (written once, then reused):
    each tensor's slice, contiguous, in the shard the tensor was in, with an index."""
    import numpy as np

    from planc.base.dtypes import dtype
    from planc.manifest import read_manifest
    from planc.tools.synth import INDEX_NAME, write_safetensors

    out = data / f"{ckpt.name}-tp{tp}-rank{rank}"
    marker = out / ".complete"
    man = read_manifest(ckpt)
    source = {s.path: [s.size_bytes, s.mtime_ns] for s in man.shards}
    if marker.exists() and json.loads(marker.read_text()).get("source") == source:
        return out  # written from this very checkpoint
    out.mkdir(parents=True, exist_ok=True)
    views = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
    weight_map, total = {}, 0
    for shard in man.shards:
        mm = np.memmap(ckpt / shard.path, np.uint8, "r")
        items = []
        for t in (t for t in man.tensors if t.file == shard.path):  # in file order
            bits = dtype(t.dtype).bits
            if bits not in views:
                raise ValueError(f"{shard.path}: {t.name}: {t.dtype} ({bits}-bit elements) cannot be sliced here")
            part = rank_slice(mm[t.start:t.end].view(views[bits]).reshape(t.shape), split_dim(t.name), tp, rank)
            items.append((t.name, t.dtype, part.shape, _chunks(part)))
            weight_map[t.name] = shard.path
            total += part.nbytes
        write_safetensors(out / shard.path, items, dict(shard.metadata) or None)
    (out / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                             indent=2, sort_keys=True) + "\n")
    os.sync()  # on disk before any load is timed: write-back would slow the first ones
    marker.write_text(json.dumps({"tp": tp, "rank": rank, "bytes": total, "source": source}))
    return out


# --------------------------------------------------------------------------- specs and plans


def write_tp_spec(ckpt: Path, out: Path, tp: int, io: dict, name: str = "") -> Path:
    """The Llama spec at `tp`; `name` given: the spec of a pre-sharded checkpoint (`tp` 1, no splits)."""
    import yaml

    spec = {"checkpoint": str(ckpt), "budget": {"host": "8GiB"}, "tensor_parallel": {"size": tp},
            "io": {**IO, **io}, "rules": [{"match": "*"}] if name else RULES}
    p = out / f"{name or f'tp{tp}'}.yaml"
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


def compile_plans(spec: Path, ranks: list[int], out: Path, tp: int, name: str = "") -> dict[int, dict]:
    """Compile and save each rank's plan; returns rank -> {path, and the plan's totals}."""
    from planc.compiler.compile import compile_spec
    from planc.plan.explain import explain_doc
    from planc.plan.codec import save_plan
    from planc.plan.predict import predict

    plans = {}
    for r in ranks:
        t0 = time.perf_counter()
        plan = compile_spec(spec, r)
        dt = time.perf_counter() - t0
        path = out / f"{name or f'tp{tp}'}-rank-{r}.json"
        save_plan(plan, path)
        doc = explain_doc(plan)
        if not doc["fits"]:
            raise SystemExit(f"tp {tp} rank {r}: refused: {doc['refusal']['message']}")
        tot = doc["totals"]
        plans[r] = {"path": str(path), "compile_s": dt, "plan_bytes": path.stat().st_size,
                    "predict": predict(plan),
                    **{k: tot[k] for k in ("payload_bytes", "read_bytes", "requests", "copies", "kernels")}}
    return plans


# --------------------------------------------------------------------------- one load per process


def worker(plan_path: str, barrier: str, result: str, verify: bool) -> None:
    """Read the plan, create the CUDA context, wait at the barrier, load, write the record."""
    t_proc = time.time()
    from planc.execute import execute
    from planc.execute.device import seam
    from planc.plan.codec import load_plan

    plan = load_plan(plan_path)
    seam.select(plan.device)
    seam.warm_up()
    # execute() imports the executor's modules on its first call; that is process start, as the
    # context is (bench/startup.py measures it), not the load: imported here, before the barrier
    from planc.execute.device import launch  # noqa: F401
    from planc.execute.pipeline import loader
    rank = plan.tensor_parallel.rank
    b = Path(barrier)
    (b / f"ready-{rank}").touch()
    t_ready = time.time()
    deadline = t_ready + BARRIER_TIMEOUT
    while not (b / "go").exists():
        if time.time() > deadline:
            raise SystemExit("barrier: no go within the timeout")
        time.sleep(0.0005)
    t0 = time.time()
    model = execute(plan, verify=verify)
    t1 = time.time()
    (b / f"loaded-{rank}").touch()
    rep = model.report.as_json()
    model.free()
    rec = {"rank": rank, "pid": os.getpid(), "t_proc": t_proc, "t_ready": t_ready, "t_start": t0, "t_end": t1,
           "report": rep}
    Path(result).write_text(json.dumps(rec))


def _wait_files(paths: list[Path], procs: list, timeout: float) -> bool:
    """Wait until every path exists; False if a process died first or the time ran out."""
    end = time.time() + timeout
    while not all(p.exists() for p in paths):
        if any(pr.poll() not in (None, 0) for pr in procs) or time.time() > end:
            return False
        time.sleep(0.001)
    return True


def run_group(plans: dict[int, dict], work: Path, verify: bool, disks: list[str], timeout: int = 500) -> dict:
    """One process per plan, started together at a barrier; returns the group record and the loads."""
    for p in work.glob("*"):
        p.unlink()
    work.mkdir(parents=True, exist_ok=True)
    t_spawn = time.time()
    procs, results = [], {}
    for r, info in plans.items():
        results[r] = work / f"result-{r}.json"
        cmd = [sys.executable, __file__, "--worker", info["path"], str(work), str(results[r])]
        if verify:
            cmd.append("--verify")
        with (work / f"stderr-{r}.txt").open("w") as err:  # a file, not a pipe: nothing blocks on a full pipe
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err))
    group = {"ranks": sorted(plans), "verify": verify, "disk_bytes": None}
    if _wait_files([work / f"ready-{r}" for r in plans], procs, timeout):
        before = diskstats()
        (work / "go").touch()
        if _wait_files([work / f"loaded-{r}" for r in plans], procs, timeout) and disks:
            group["disk_bytes"] = disk_read_bytes(before, diskstats(), disks)
    else:  # one died or hung before the barrier: the others would wait for a go that never comes
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
    errors = []
    for r, pr in zip(plans, procs):
        try:
            pr.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pr.kill()
            pr.wait()
        if pr.returncode != 0:
            errors.append(f"rank {r}: rc {pr.returncode}: " + (work / f"stderr-{r}.txt").read_text()[-1500:])
    group["process_wall_s"] = time.time() - t_spawn
    loads = [json.loads(results[r].read_text()) for r in plans if results[r].exists()]
    if errors or len(loads) != len(plans):
        group["error"] = "\n".join(errors)[-3000:] or "a process wrote no result"
        return {"group": group, "loads": loads}
    group["load_wall_s"] = max(x["t_end"] for x in loads) - min(x["t_start"] for x in loads)
    group["start_skew_s"] = max(x["t_start"] for x in loads) - min(x["t_start"] for x in loads)
    group["payload_bytes"] = sum(x["report"]["payload_bytes"] for x in loads)
    group["gb_per_s"] = group["payload_bytes"] / group["load_wall_s"] / 1e9
    group["predicted"] = predicted_group(plans)
    return {"group": group, "loads": loads}


def predicted_group(plans: dict[int, dict]) -> dict:
    """The plans' predicted wall loading at once (`planc.plan.predict.predict_node`), all on the one
    GPU this bench uses (one plan: its own prediction)."""
    from planc.plan.codec import load_plan
    from planc.plan.predict import predict_node

    loaded = [load_plan(info["path"]) for info in plans.values()]
    p = predict_node(loaded, ["cuda:0"] * len(loaded))
    return {"warm_s": p["warm_seconds"], "cold_s": p["cold_seconds"]}


def load_record(x: dict, plan: dict) -> dict:
    """A process's load: measured next to the report's predictions and the plan's own totals."""
    rep = x["report"]
    h = rep["host"]
    wall = x["t_end"] - x["t_start"]
    rec = {
        "rank": x["rank"], "load_s": wall, "gb_per_s": rep["payload_bytes"] / wall / 1e9,
        "report_wall_s": rep["wall_seconds"], "report_gb_per_s": rep["gb_per_s"],
        "payload_bytes": rep["payload_bytes"], "plan_read_bytes": plan["read_bytes"],
        "bytes_read": rep["bytes_read"], "requests": rep["requests"], "copies": rep["copies"],
        "kernels": rep["kernels"], "plan_requests": plan["requests"], "plan_copies": plan["copies"],
        "host_growth_bytes": h["growth_bytes"], "host_predicted_bytes": h["predicted_peak_bytes"],
        "hwm_reset": h.get("hwm_reset"), "files": rep.get("files"), "timings": rep.get("timings"),
        "t_start": x["t_start"], "t_end": x["t_end"], "ready_to_start_s": x["t_start"] - x["t_ready"],
        "process_setup_s": x["t_ready"] - x["t_proc"],
        "predicted": rep.get("predicted"), "plan_predict": plan.get("predict"),
    }
    if "verify" in rep:
        rec["verify_ok"] = rep["verify"]["ok"]
    return rec


# --------------------------------------------------------------------------- summary and targets


def medians(groups: list[dict]) -> dict:
    """(case, tp, mode) -> medians of the timed (not verify) groups."""
    by: dict = {}
    for g in groups:
        if g.get("verify") or "error" in g or "load_wall_s" not in g:
            continue
        by.setdefault((g["case"], g["tp"], g["mode"]), []).append(g)
    out = {}
    for key, gs in by.items():
        m = {k: statistics.median(g[k] for g in gs) for k in ("load_wall_s", "process_wall_s", "gb_per_s")}
        disk = [g["disk_bytes"] for g in gs if g.get("disk_bytes") is not None]
        m["disk_bytes"] = statistics.median(disk) if disk else None
        m["payload_bytes"] = gs[0]["payload_bytes"]
        m["predicted_s"] = (gs[0].get("predicted") or {}).get(f"{key[2]}_s")
        m["n"] = len(gs)
        out[key] = m
    return out


def evaluate(groups: list[dict], loads: list[dict], checkpoint_bytes: int) -> list[dict]:
    """The issue's targets from the records; each {target, value, limit, ok, what}. Missing inputs: no check."""
    med = medians(groups)
    checks = []
    whole = med.get(("whole", 1, "warm"))
    for (case, tp, mode), m in sorted(med.items(), key=lambda kv: _order(kv[0])):
        if case == "alone" and mode == "warm" and whole:
            checks.append(_check(f"alone tp{tp} warm GB/s / whole", m["gb_per_s"] / whole["gb_per_s"],
                                 ALONE_GBS_MIN, at_least=True))
        if case == "all" and mode == "warm" and whole:
            checks.append(_check(f"all tp{tp} warm load wall / whole", m["load_wall_s"] / whole["load_wall_s"],
                                 GROUP_WALL_MAX))
        if m.get("predicted_s"):
            checks.append({"target": f"{case} tp{tp} {mode} load wall / predicted", "value": m["load_wall_s"] / m["predicted_s"],
                           "limit": f"1 +- {PREDICTED_TOL}", "ok": abs(m["load_wall_s"] / m["predicted_s"] - 1) <= PREDICTED_TOL,
                           "what": f"{m['load_wall_s']:.3f} s / {m['predicted_s']:.3f} s"})
        if case in ("whole", "all") and mode == "cold" and m["disk_bytes"] is not None:
            checks.append(_check(f"{case} tp{tp} cold disk bytes / checkpoint", m["disk_bytes"] / checkpoint_bytes,
                                 COLD_DISK_MAX))
    if loads:
        worst = max(loads, key=lambda x: abs(x["host_growth_bytes"] / max(1, x["host_predicted_bytes"]) - 1))
        ratio = worst["host_growth_bytes"] / max(1, worst["host_predicted_bytes"])
        checks.append({"target": "host growth / predicted (worst load)", "value": ratio,
                       "limit": f"1 +- {HOST_GROWTH_TOL}", "ok": abs(ratio - 1) <= HOST_GROWTH_TOL,
                       "what": f"{worst['case']} tp{worst['tp']} rank {worst['rank']} {worst['mode']}"})
        off = [x for x in loads if not _counts_match(x)]
        checks.append({"target": "requests and copies issued = plan's", "value": len(loads) - len(off),
                       "limit": len(loads), "ok": not off,
                       "what": ", ".join(f"{x['case']} tp{x['tp']} rank {x['rank']}" for x in off[:5])})
        ver = [x for x in loads if "verify_ok" in x]
        if ver:
            checks.append({"target": "--verify bit-exact", "value": sum(x["verify_ok"] for x in ver),
                           "limit": len(ver), "ok": all(x["verify_ok"] for x in ver), "what": ""})
    failed = [g for g in groups if "error" in g]
    if failed:
        checks.append({"target": "every group ran", "value": len(groups) - len(failed), "limit": len(groups),
                       "ok": False, "what": ", ".join(f"{g['case']} tp{g['tp']} {g['mode']}" for g in failed[:5])})
    return checks


def _counts_match(x: dict) -> bool:
    return (x["requests"]["issued"] == x["requests"]["predicted"] == x["plan_requests"]
            and x["copies"]["issued"] == x["copies"]["predicted"] == x["plan_copies"])


def _check(target: str, value: float, limit: float, at_least: bool = False) -> dict:
    ok = value >= limit if at_least else value <= limit
    return {"target": target, "value": value, "limit": f"{'>=' if at_least else '<='} {limit}", "ok": ok, "what": ""}


CASE_ORDER = {"whole": 0, "alone": 1, "sharded": 2, "all": 3}


def _order(key: tuple) -> tuple:
    case, tp, mode = key
    return CASE_ORDER.get(case, 9), tp, mode != "warm"


def load_lines(loads: list[dict]) -> list[str]:
    """Per (case, tp, mode), over its timed loads: the per-process figures, measured against planned."""
    by: dict = {}
    for x in loads:
        if not x["verify"]:
            by.setdefault((x["case"], x["tp"], x["mode"]), []).append(x)
    lines = ["| case | TP | mode | loads | GB/s per process (median) | bytes read / payload | requests issued / plan "
             "| copies issued / plan | host growth / predicted (worst) |", "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(by, key=_order):
        xs = by[key]
        gbs = statistics.median(x["gb_per_s"] for x in xs)
        read = max(x["bytes_read"]["measured"] / max(1, x["payload_bytes"]) for x in xs)
        req = f"{sum(x['requests']['issued'] for x in xs):,} / {sum(x['plan_requests'] for x in xs):,}"
        cop = f"{sum(x['copies']['issued'] for x in xs):,} / {sum(x['plan_copies'] for x in xs):,}"
        host = max((x["host_growth_bytes"] / max(1, x["host_predicted_bytes"]) for x in xs), key=lambda v: abs(v - 1))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(xs)} | {gbs:.2f} | {read:.2f} | {req} | {cop} | "
                     f"{host:.3f} |")
    return lines


def ceiling_lines(med: dict) -> list[str]:
    """Per TP size with both a rank alone and its pre-sharded checkpoint (warm): the rank's GB/s
    against the whole load's, the pre-sharded load's against the whole load's (what a load of that
    size costs, whatever it reads), and the rank's against the pre-sharded one's (the read path)."""
    whole = med.get(("whole", 1, "warm"))
    tps = sorted(tp for (case, tp, mode) in med if case == "sharded" and mode == "warm" and ("alone", tp, "warm") in med)
    if not whole or not tps:
        return []
    lines = ["", "| TP | alone GB/s | pre-sharded GB/s | alone / whole | pre-sharded / whole | alone / pre-sharded |",
             "|---|---|---|---|---|---|"]
    for tp in tps:
        a, s = med[("alone", tp, "warm")]["gb_per_s"], med[("sharded", tp, "warm")]["gb_per_s"]
        w = whole["gb_per_s"]
        lines.append(f"| {tp} | {a:.2f} | {s:.2f} | {a / w:.2f} | {s / w:.2f} | {a / s:.2f} |")
    return lines


def summary_lines(groups: list[dict], loads: list[dict], checks: list[dict], notes: list[str]) -> list[str]:
    med = medians(groups)
    lines = ["| case | TP | mode | load wall s | process wall s | payload GiB | GB/s | disk GiB | n |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (case, tp, mode), m in sorted(med.items(), key=lambda kv: _order(kv[0])):
        disk = "-" if m["disk_bytes"] is None else f"{m['disk_bytes'] / 2**30:.2f}"
        lines.append(f"| {case} | {tp} | {mode} | {m['load_wall_s']:.3f} | {m['process_wall_s']:.2f} | "
                     f"{m['payload_bytes'] / 2**30:.2f} | {m['gb_per_s']:.2f} | {disk} | {m['n']} |")
    lines += [""] + load_lines(loads) + ceiling_lines(med)
    lines += ["", "| target | value | limit | met | where |", "|---|---|---|---|---|"]
    for c in checks:
        v = f"{c['value']:.3f}" if isinstance(c["value"], float) else str(c["value"])
        lines.append(f"| {c['target']} | {v} | {c['limit']} | {'PASS' if c['ok'] else 'FAIL'} | {c['what']} |")
    met = sum(c["ok"] for c in checks)
    lines.append(f"\ntargets: {met} of {len(checks)} met: {'PASS' if checks and met == len(checks) else 'FAIL'}")
    return lines + [f"note: {n}" for n in notes]


# --------------------------------------------------------------------------- driver


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", type=Path, help="where the checkpoint is written once (and reused)")
    ap.add_argument("out", nargs="?", type=Path, help="where plans, tp.jsonl and tp_summary.json go")
    ap.add_argument("--cases", default="whole,alone,all", help="whole, alone, sharded, all (comma-separated)")
    ap.add_argument("--tp", default="2,4,8", help="sizes whose rank 0 is loaded alone")
    ap.add_argument("--group-tp", type=int, default=8, help="size whose ranks all load at once")
    ap.add_argument("--modes", default="warm,cold", help="warm, cold (comma-separated)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case and mode (median kept)")
    ap.add_argument("--no-verify", action="store_true", help="skip the extra --verify run per case")
    ap.add_argument("--size", default="15GiB", help="checkpoint size (Llama-3-8B-shaped from ~8 GB up)")
    ap.add_argument("--io", default="", help="io settings over the defaults, e.g. merge_gap=64KiB")
    ap.add_argument("--deadline", type=float, default=540.0,
                    help="seconds after which no new run starts (the summary is still printed)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return a
    if a.data is None or a.out is None:
        ap.error("DATA_DIR and OUT_DIR are required")
    a.cases = [c for c in a.cases.split(",") if c]
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [c for c in a.cases if c not in CASE_ORDER] + [m for m in a.modes if m not in ("warm", "cold")]
    if bad:
        ap.error(f"unknown cases or modes: {bad}")
    a.tp = [int(x) for x in a.tp.split(",") if x]
    if a.repeat < 1 or a.group_tp < 1 or any(t < 1 for t in a.tp):
        ap.error("--repeat, --tp and --group-tp must be at least 1")
    a.io = {k: (int(v) if v.isdigit() else v) for k, v in (kv.split("=", 1) for kv in a.io.split(",") if kv)}
    return a


def plan_sets(a) -> list[tuple[str, int, list[int]]]:
    """(case, tp, ranks) to run, in order: the reference first."""
    out = []
    if "whole" in a.cases:
        out.append(("whole", 1, [0]))
    if "alone" in a.cases:
        out += [("alone", t, [0]) for t in a.tp if t > 1]
    if "sharded" in a.cases:
        out += [("sharded", t, [0]) for t in a.tp if t > 1]
    if "all" in a.cases:
        out.append(("all", a.group_tp, list(range(a.group_tp))))
    return out


def schedule(a) -> list[tuple[str, int, bool]]:
    """(mode, rep, verify) in order: the --verify runs first (they also build the kernel cache and
    warm the page cache, untimed), then every warm run, then every cold one, so that the page cache
    is warmed again once, not after each cold case."""
    runs = [] if a.no_verify else [("warm", 0, True)]
    for mode in ("warm", "cold"):
        if mode in a.modes:
            runs += [(mode, k, False) for k in range(a.repeat)]
    return runs


def run_all(a, sets, files, disks, out: Path, log, t_begin: float, notes: list) -> tuple[list, list]:
    """Every scheduled run of every case; stops at the deadline, or at the first cold run when the
    page cache cannot be dropped (cold runs come last, so nothing else is lost)."""
    from common import drop_page_cache
    from peers import warm

    groups, loads = [], []
    for mode, rep, verify in schedule(a):
        for case, tp, plans in sets:
            if time.time() - t_begin > a.deadline:
                notes.append(f"deadline of {a.deadline:.0f} s reached: {case} tp{tp} {mode} rep {rep} "
                             "and the runs after it not run")
                return groups, loads
            if mode == "warm":
                warm(files)
            elif not drop_page_cache():
                notes.append("cannot drop the page cache here (/proc/sys/vm/drop_caches): cold runs skipped")
                return groups, loads
            left = a.deadline + 50 - (time.time() - t_begin)  # a stuck group cannot outlast the call
            res = run_group(plans, out / "barrier", verify, disks, timeout=max(60, int(left)))
            g = {**res["group"], "case": case, "tp": tp, "mode": mode, "rep": rep, "time": time.time()}
            recs = [{**load_record(x, plans[x["rank"]]), "case": case, "tp": tp, "mode": mode, "rep": rep,
                     "verify": verify} for x in res["loads"]]
            for r in recs:
                log.write(json.dumps({"kind": "load", **r}) + "\n")
            log.write(json.dumps({"kind": "group", **g}) + "\n")
            log.flush()
            groups.append(g)
            loads += recs
            _say(g)
    return groups, loads


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        worker(*a.worker, a.verify)
        return 0
    from common import ensure_checkpoint

    from planc.base.units import parse_bytes

    t_begin = time.time()
    a.data.mkdir(parents=True, exist_ok=True)
    out = a.out.resolve()
    (out / "plans").mkdir(parents=True, exist_ok=True)
    ckpt = ensure_checkpoint(a.data, "dense", parse_bytes(a.size), 4)
    os.sync()  # a checkpoint just written is on disk before any load is timed (write-back slows loads)
    files = sorted(str(p) for p in ckpt.glob("*.safetensors"))
    ck_bytes = sum(os.path.getsize(f) for f in files)
    disks = whole_disks(list(diskstats()))
    notes = [f"checkpoint {ckpt} {ck_bytes / 2**30:.2f} GiB, ready after {time.time() - t_begin:.0f} s",
             f"disks counted: {', '.join(disks) or 'none found: disk bytes not measured'}"]
    print(notes[0], flush=True)
    sets = []
    for case, tp, ranks in plan_sets(a):
        if case == "sharded":
            t_w = time.time()
            own = write_presharded(ckpt, a.data, tp)
            files += sorted(str(p) for p in own.glob("*.safetensors"))
            name = f"sharded-tp{tp}"
            plans = compile_plans(write_tp_spec(own, out / "plans", 1, a.io, name), ranks, out / "plans", 1, name)
            print(f"[sharded tp{tp}] rank 0's bytes as a checkpoint of their own: {own} "
                  f"(ready after {time.time() - t_w:.0f} s)", flush=True)
        else:
            plans = compile_plans(write_tp_spec(ckpt, out / "plans", tp, a.io), ranks, out / "plans", tp)
        p0 = plans[ranks[0]]
        print(f"[{case} tp{tp}] {len(ranks)} plan(s): rank {ranks[0]} payload {p0['payload_bytes'] / 2**30:.2f} GiB, "
              f"read {p0['read_bytes'] / 2**30:.2f} GiB, {p0['requests']} requests, compile {p0['compile_s']:.2f} s",
              flush=True)
        sets.append((case, tp, plans))
    with (out / "tp.jsonl").open("a") as log:
        groups, loads = run_all(a, sets, files, disks, out, log, t_begin, notes)
    checks = evaluate(groups, loads, ck_bytes)
    lines = summary_lines(groups, loads, checks, notes)
    print("\n".join(lines), flush=True)
    (out / "tp_summary.json").write_text(json.dumps(
        {"medians": {"/".join(map(str, k)): v for k, v in medians(groups).items()}, "checks": checks,
         "notes": notes, "checkpoint_bytes": ck_bytes}, indent=1))
    return 0


def _say(g: dict) -> None:
    tag = f"  {g['case']} tp{g['tp']} {g['mode']} rep {g['rep']}{' verify' if g['verify'] else ''}"
    if "error" in g:
        print(f"{tag}: ERROR {g['error'][-800:]}", flush=True)
        return
    disk = g.get("disk_bytes")
    print(f"{tag}: load wall {g['load_wall_s']:.3f} s ({g['gb_per_s']:.2f} GB/s), process wall "
          f"{g['process_wall_s']:.2f} s, start skew {g['start_skew_s'] * 1e3:.1f} ms, disk "
          f"{'-' if disk is None else f'{disk / 2**30:.2f} GiB'}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
