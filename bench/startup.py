"""Time to a ready model, in fresh processes: what surrounds the streaming load.

    python3 bench/startup.py DATA OUT [--repeat 3] [--no-large] [--no-torch]

Needs a GPU (and, for the torch cells, torch and transformers). DATA holds the checkpoints: a
2.2 GB Llama that transformers writes (`save_pretrained`, as `bench/handoff.py` does) and, unless
`--no-large`, the 14.96 GiB dense checkpoint of the other benches (`bench/common.py`). Every cell
is a fresh process, repeated `--repeat` times, the cells interleaved; medians are reported.

* `run`: `planc run PLAN --json`, process wall (spawn to exit) against the load inside it
  (`wall_seconds` of the report) and the report's `prepare`; the difference is what a user waits for
  beyond the streaming. For the 2.2 GB bf16 plan and the 14.96 GiB dense plan.
* `run-pyc`: the same with bytecode for every library it imports, as a pip install has it
  (`libs_bytecode`: a read-only install without it is compiled into a cache folder of the bench's).
* `runclock`: `planc run PLAN --json` as `python -m planc` runs it, under `-X importtime`, with a
  clock on the driver's start and the context (which thread, from when to when), on reading the
  plan and on `execute`; for the 2.2 GB plan and the 14.96 GiB one.
* `phases`: the same load through the Python API with a clock at each step: interpreter start,
  `import planc.execute` (the executor: no numba on a GPU), the CUDA context, reading the plan, `execute` (and its report's
  `prepare` / load / release), exit.
* `first` / `later`: `planc run` of the 2.2 GB plan converted to fp16 on the device (so kernels
  run), first with an empty kernel folder (PLANC_KERNEL_DIR) and an empty driver JIT cache
  (CUDA_CACHE_PATH), as on a new machine, then once more with the same folders; `--repeat` times,
  new folders each time; host growth against the plan's prediction in each.
* In a process that has already imported torch, transformers and its Llama modeling code, and
  created its CUDA context (not timed): `torch-planc`, `planc.load_into` a meta-device module built from the config, from the
  saved plan, to a ready module (the `import planc` inside the clock); `torch-hf`,
  `from_pretrained(device_map="cuda")`; `torch-state`, `planc.load(plan).state_dict()`.
* `exit-*`: what leaving a CUDA process costs (from the child's last word to the parent's wait):
  a context alone, with 2.2 GB of device memory freed or still held, and after a primary-context
  reset.
* `safetensors`: a fresh process that imports torch and reads every shard with
  `safetensors.torch.load_file(device="cuda")`: process wall and load.

Prints the tables and writes OUT/startup.jsonl (one line per process) and OUT/startup.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


# --------------------------------------------------------------------------- children


def child_phases(plan_path: str, spawned: float) -> dict:
    t = {"started": time.time() - spawned}
    c0 = time.perf_counter()
    import numpy  # noqa: F401

    t["import_numpy_s"] = time.perf_counter() - c0
    c0 = time.perf_counter()
    import planc.execute
    import planc.execute.pipeline.loader  # noqa: F401 - the whole executor
    from planc.execute.device import driver, seam

    t["import_execute_s"] = time.perf_counter() - c0
    c0 = time.perf_counter()
    driver.lib()  # libcuda loaded, cuInit
    t["cuinit_s"] = time.perf_counter() - c0
    c0 = time.perf_counter()
    seam.select("cuda:0")  # the primary context retained and made current
    t["context_s"] = time.perf_counter() - c0
    c0 = time.perf_counter()
    from planc.plan.codec import load_plan

    plan = load_plan(plan_path)
    t["load_plan_s"] = time.perf_counter() - c0
    c0 = time.perf_counter()
    model = planc.execute.execute(plan)
    t["execute_s"] = time.perf_counter() - c0
    rep = model.report.as_json()
    t.update(wall_seconds=rep["wall_seconds"], prepare_s=rep["timings"].get("prepare"),
             free_s=rep["timings"].get("free"), release_s=rep["timings"].get("release"),
             timings=rep["timings"], payload_bytes=rep["payload_bytes"])
    model.free()
    t["numba_imported"] = "numba" in sys.modules
    t["until_exit_s"] = time.time() - spawned
    return t


def child_pin(slot_mib: int, slots: int) -> dict:
    """What a pinned ring costs: allocation and release by numba, registration of an anonymous mapping
    (4 KiB and transparent huge pages), and copies from pageable memory for comparison."""
    import mmap

    import numpy as np
    from numba import cuda

    ctx = cuda.current_context()
    slot = slot_mib << 20
    n = slot * slots
    out = {}
    t0 = time.perf_counter()
    ring = [cuda.pinned_array(slot, dtype=np.uint8) for _ in range(slots)]
    out["pinned_array_slots_s"] = time.perf_counter() - t0
    from planc.execute.device import driver

    t0 = time.perf_counter()
    own = [driver.pinned_array(slot) for _ in range(slots)]
    out["planc_driver_slots_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    del own
    out["planc_driver_free_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    del ring
    import gc

    gc.collect()
    ctx.memory_manager.deallocations.clear()
    out["free_slots_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    one = cuda.pinned_array(n, dtype=np.uint8)
    out["pinned_array_one_s"] = time.perf_counter() - t0
    del one
    gc.collect()
    ctx.memory_manager.deallocations.clear()
    for name, huge in (("register_4k_s", False), ("register_thp_s", True)):
        mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if huge and hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)
        arr = np.frombuffer(mm, dtype=np.uint8)
        t0 = time.perf_counter()
        arr[::4096] = 1
        out[name.replace("register", "touch")] = time.perf_counter() - t0
        t0 = time.perf_counter()
        pinned = ctx.mempin(arr, arr.ctypes.data, n, mapped=False)
        out[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        del pinned
        gc.collect()
        ctx.deallocations.clear()
        ctx.memory_manager.deallocations.clear()
        out[name.replace("register", "unregister")] = time.perf_counter() - t0
        del arr
        mm.close()
    host = np.ones(n, dtype=np.uint8)
    dev = cuda.device_array(n, dtype=np.uint8)
    dev[:slot].copy_to_device(host[:slot])
    cuda.synchronize()
    t0 = time.perf_counter()
    for o in range(0, n, slot):
        dev[o:o + slot].copy_to_device(host[o:o + slot])
    cuda.synchronize()
    out["pageable_h2d_gb_s"] = n / (time.perf_counter() - t0) / 1e9
    out["ring_bytes"] = n
    return out


def _torch_ready():
    """torch, transformers and the Llama modeling code imported (transformers imports it lazily, seconds
    on first use), and torch's CUDA context created: what a serving process has before it loads."""
    import torch
    import transformers
    from transformers.models.llama import modeling_llama  # noqa: F401

    transformers.AutoModelForCausalLM  # noqa: B018 - resolves the lazy attribute
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()


def child_torch(kind: str, ckpt: str, plan_path: str) -> dict:
    import torch

    _torch_ready()
    t0 = time.perf_counter()
    out: dict = {}
    if kind == "torch-hf":
        import transformers

        m = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, device_map="cuda")
        m.eval()
    elif kind == "torch-planc":
        import transformers

        import planc

        out["import_planc_s"] = time.perf_counter() - t0
        config = transformers.AutoConfig.from_pretrained(ckpt)
        with torch.device("meta"):
            m = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        t1 = time.perf_counter()
        res = planc.load_into(m, plan_path)
        m.eval()
        out.update(meta_s=t1 - t0 - out["import_planc_s"], load_into_s=time.perf_counter() - t1,
                   wall_seconds=res.report["wall_seconds"], timings=res.report["timings"])
    else:  # torch-state
        import planc

        out["import_planc_s"] = time.perf_counter() - t0
        model = planc.load(plan_path)
        sd = model.state_dict()
        out.update(tensors=len(sd), wall_seconds=model.report["wall_seconds"], timings=model.report["timings"])
    torch.cuda.synchronize()
    out["ready_s"] = time.perf_counter() - t0
    return out


def child_runclock(plan_path: str, spawned: float) -> None:
    """`planc run PLAN --json` as `python -m planc` runs it, with a clock on the driver's start, the
    context, and `execute` (run under -X importtime by the parent, which reads the imports' times);
    the figures go to stderr as one `RUNCLOCK {...}` line before the command exits."""
    import threading

    import planc.execute as pe
    from planc.execute.device import driver

    ev: dict = {"child_started": time.time() - spawned}

    def wrap(name: str):
        real = getattr(driver, name)

        def timed(*a, **k):
            t0 = time.time() - spawned
            try:
                return real(*a, **k)
            finally:
                t1 = time.time() - spawned
                if t1 - t0 > 0.001:  # the first calls; later ones find everything made
                    ev.setdefault(name, []).append((threading.current_thread().name, round(t0, 4), round(t1, 4)))

        setattr(driver, name, timed)

    wrap("lib")
    wrap("primary_context")
    real_execute = pe.execute

    def execute(*a, **k):
        t0 = time.time() - spawned
        ev["numpy_before_execute"] = "numpy" in sys.modules
        m = real_execute(*a, **k)
        ev["execute"] = (round(t0, 4), round(time.time() - spawned, 4))
        ev["timings"] = m.report["timings"]
        ev["wall_seconds"] = m.report["wall_seconds"]
        sys.stderr.write("RUNCLOCK " + json.dumps(ev) + "\n")
        sys.stderr.flush()
        return m

    pe.execute = execute
    import planc.plan.codec as pp

    real_load = pp.load_plan

    def load_plan(*a, **k):  # reading and checking the plan file: it grows with the plan
        t0 = time.time() - spawned
        try:
            return real_load(*a, **k)
        finally:
            ev["load_plan"] = (round(t0, 4), round(time.time() - spawned, 4))

    pp.load_plan = load_plan
    from planc.execute.pipeline import model as pm

    real_free = pm.LoadedModel.free

    def free(self):  # the device memory given back after the report: it grows with the plan
        t0 = time.time() - spawned
        try:
            return real_free(self)
        finally:
            ev.setdefault("free", (round(t0, 4), round(time.time() - spawned, 4)))
            sys.stderr.write("RUNCLOCK_FREE " + json.dumps(ev["free"]) + "\n")
            sys.stderr.flush()

    pm.LoadedModel.free = free
    sys.argv = ["planc", "run", plan_path, "--json"]
    from planc.face.entry import main

    main()


def child_exit(nbytes: int, how: str, spawned: float) -> None:
    """What a CUDA process's exit costs: the context made, `nbytes` of device memory allocated and,
    unless `how` is `held`, freed; `reset` also resets the primary context before leaving. Prints
    the time it leaves at, then `os._exit`; the parent takes the rest from its own clock."""
    from planc.execute.device import driver, seam

    seam.select("cuda:0")
    mem = driver.DeviceMemory(nbytes) if nbytes else None
    t0 = time.time()
    if how != "held" and mem is not None:
        mem.free()
    free_s = time.time() - t0
    t0 = time.time()
    if how == "reset":
        cu = driver.lib()
        cu.cuDevicePrimaryCtxReset.argtypes = [ctypes.c_int]
        cu.cuDevicePrimaryCtxReset(0)
    print(json.dumps({"leaving": time.time() - spawned, "reset_s": time.time() - t0, "free_s": free_s}), flush=True)
    os._exit(0)


def cell_exit(nbytes: int, how: str) -> dict:
    spawned = time.time()
    wall, text, _ = _spawn(_self("--child", "exit", nbytes, how, repr(spawned)))
    got = _last_json(text)
    return {"process_s": wall, "exit_s": time.time() - spawned - got["leaving"], "reset_s": got["reset_s"],
            "free_s": got.get("free_s", 0.0)}


def cell_runclock(plan: Path) -> dict:
    spawned = time.time()
    wall, _, err = _spawn([sys.executable, "-X", "importtime", _self()[1], "--child", "runclock", str(plan),
                           repr(spawned)])
    out = {"process_s": wall}
    for line in err.splitlines():
        if line.startswith("RUNCLOCK "):
            out.update(json.loads(line[len("RUNCLOCK "):]))
        elif line.startswith("RUNCLOCK_FREE "):
            out["free"] = json.loads(line[len("RUNCLOCK_FREE "):])
            out["after_free_s"] = wall - out["free"][1]
        elif line.startswith("import time:") and line.count("|") == 2:
            _, cum, name = line.split("|")
            name = name.strip()
            if name in ("planc.face.cli", "typer", "numpy", "planc.execute.pipeline.loader", "planc.plan.codec", "planc.face.prestart",
                        "rich.console"):
                out[f"import_{name}_s"] = int(cum) / 1e6
    return out


def child_safetensors(ckpt: str) -> dict:
    t0 = time.perf_counter()
    import torch
    from safetensors.torch import load_file

    torch.zeros(1, device="cuda")
    t1 = time.perf_counter()
    n = 0
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        n += len(load_file(str(f), device="cuda"))
    torch.cuda.synchronize()
    return {"import_and_context_s": t1 - t0, "load_s": time.perf_counter() - t1, "tensors": n}


# --------------------------------------------------------------------------- the parent


def _spawn(argv: list[str], env: dict | None = None) -> tuple[float, str, str]:
    e = dict(os.environ, **(env or {}))
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=e, cwd=ROOT, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return wall, p.stdout, p.stderr


def _self(*args) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *map(str, args)]


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    start = text.find("{")
    return json.loads(text[start:])


def _child(*args) -> dict:
    wall, text, _ = _spawn(_self("--child", *args))
    return dict(_last_json(text), process_s=wall)


def cell_run(plan: Path, env: dict | None = None) -> dict:
    wall, out, _ = _spawn([sys.executable, "-m", "planc", "run", str(plan), "--json"], env)
    rep = json.loads(out)
    h = rep["host"]
    return {"process_s": wall, "load_s": rep["wall_seconds"], "outside_s": wall - rep["wall_seconds"],
            "prepare_s": rep["timings"].get("prepare"), "timings": rep["timings"],
            "growth_over_predicted": h["growth_bytes"] / h["predicted_peak_bytes"],
            "kernel_code": rep.get("kernel_code"), "payload_bytes": rep["payload_bytes"]}


def prepare(data: Path, out: Path, large: bool) -> dict:
    """The checkpoints, specs and plans (compiled once, saved); the package's bytecode compiled, as
    an installed package has it (pip compiles at install; a checkout run with
    PYTHONDONTWRITEBYTECODE=1 would compile every module in every process)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "planc")], check=True)
    from common import ensure_checkpoint
    from common import write_spec as dense_spec
    from handoff import write_model
    from handoff import write_spec as hf_spec

    import planc.compiler.compile
    import planc.plan.codec

    llama = write_model(data, "llama-2GB", 0)
    plans = {}
    for name, spec in (("llama-bf16", hf_spec(out, "transformers-llama", llama, "bf16", "llama-bf16")),
                       ("llama-fp16", hf_spec(out, "transformers-llama", llama, "fp16", "llama-fp16"))):
        plans[name] = out / f"{name}.plan.json"
        planc.plan.codec.save_plan(planc.compiler.compile.compile_spec(spec), plans[name])
    if large:
        dense = ensure_checkpoint(data, "dense", 15 << 30, 4)
        spec = dense_spec(dense, "copy")
        plans["dense-15GiB"] = out / "dense.plan.json"
        planc.plan.codec.save_plan(planc.compiler.compile.compile_spec(spec), plans["dense-15GiB"])
    return {"llama": llama, "plans": plans}


def libs_bytecode(out: Path) -> dict:
    """Bytecode for every library `planc run` imports, as a pip install has it (pip compiles at
    install). Where a library's folder holds none and cannot take it (a read-only install: every
    process compiles it again, numpy's import then costs 0.2-0.3 s), it is compiled into a cache
    folder of the bench's own (PYTHONPYCACHEPREFIX); `run-*-pyc` cells run with that folder.
    Returns {"prefix": ..., "missing": [libraries found without bytecode]}."""
    probe = ("import sys, json, planc.face.cli, planc.execute, planc.plan.codec, numpy; "
             "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) "
             "if getattr(m, '__file__', None) and m.__file__.endswith('.py')})))")
    files = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      check=True).stdout)
    import importlib.util

    def top(f: str) -> str:
        parts = Path(f).parts
        at = max(i for i, x in enumerate(parts) if x in ("site-packages", "dist-packages"))
        return parts[at + 1]

    missing = sorted({top(f) for f in files if "site-packages" in f or "dist-packages" in f
                      if not Path(importlib.util.cache_from_source(f)).exists()})
    prefix = out / "pycache"
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix))
    subprocess.run([sys.executable, "-m", "compileall", "-q", *files], env=env, check=False,
                   stdout=subprocess.DEVNULL)
    return {"prefix": str(prefix), "missing": missing}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-large", action="store_true", help="leave out the 14.96 GiB checkpoint")
    ap.add_argument("--no-torch", action="store_true", help="leave out the cells that import torch")
    ap.add_argument("--cells", default="", help="run only the cells whose names start with one of these "
                                                "(comma-separated), e.g. torch,run")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        kind, *rest = a.child
        if kind == "exit":
            child_exit(int(rest[0]), rest[1], float(rest[2]))
            return 0
        if kind == "runclock":
            child_runclock(rest[0], float(rest[1]))
            return 0
        if kind == "phases":
            res = child_phases(rest[0], float(rest[1]))
        elif kind == "pin":
            res = child_pin(int(rest[0]), int(rest[1]))
        elif kind == "safetensors":
            res = child_safetensors(rest[0])
        else:
            res = child_torch(kind, rest[0], rest[1])
        print(json.dumps(res))
        return 0
    if not (a.data and a.out):
        ap.error("DATA and OUT are required")
    data, out = Path(a.data), Path(a.out)
    data.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    got = prepare(data, out, not a.no_large)
    plans, llama = got["plans"], got["llama"]
    log = out / "startup.jsonl"
    rows: dict[str, list] = {}

    wanted = [c for c in a.cells.split(",") if c]

    def record(name: str, fn) -> None:
        if wanted and not any(name.startswith(c) for c in wanted):
            return
        try:
            r = fn()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one failed cell is reported, the rest run
            print(f"{name}: FAILED {str(e)[-2000:]}", flush=True)
            return
        r = dict(r, cell=name, time=time.time())
        rows.setdefault(name, []).append(r)
        with open(log, "a") as f:
            f.write(json.dumps(r) + "\n")
        brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                 if k != "time" and (isinstance(v, float) or k in ("lib", "primary_context", "execute"))}
        print(name, brief, flush=True)

    # a new machine: empty kernel folder and driver cache; then later loads with the same folders
    for k in range(a.repeat):
        fresh = out / f"fresh-caches-{k}"
        shutil.rmtree(fresh, ignore_errors=True)
        env = {"PLANC_KERNEL_DIR": str(fresh / "kernels"), "CUDA_CACHE_PATH": str(fresh / "nv")}
        record("first", lambda: cell_run(plans["llama-fp16"], env))
        record("later", lambda: cell_run(plans["llama-fp16"], env))
    record("pin", lambda: _child("pin", 16, 16))
    for k in range(a.repeat):
        sizes = [(0, "freed"), (2200 << 20, "freed"), (2200 << 20, "held"), (2200 << 20, "reset")]
        if "dense-15GiB" in plans:  # the device memory of the large plan: does its exit cost more?
            sizes += [(15 << 30, "freed"), (15 << 30, "held")]
        for nbytes, how in sizes:
            record(f"exit-{nbytes >> 20}MiB-{how}", lambda nbytes=nbytes, how=how: cell_exit(nbytes, how))

    def phases():
        spawned = time.time()
        wall, text, _ = _spawn(_self("--child", "phases", plans["llama-bf16"], spawned))
        return dict(_last_json(text), process_s=wall)

    pyc = libs_bytecode(out)
    print(f"libraries without bytecode in their own folders: {pyc['missing'] or 'none'}", flush=True)
    penv = {"PYTHONPYCACHEPREFIX": pyc["prefix"]}
    for k in range(a.repeat):
        record("run-llama-bf16", lambda: cell_run(plans["llama-bf16"]))
        record("run-pyc-llama-bf16", lambda: cell_run(plans["llama-bf16"], penv))
        if "dense-15GiB" in plans:
            record("run-pyc-dense-15GiB", lambda: cell_run(plans["dense-15GiB"], penv))
        record("runclock-llama-bf16", lambda: cell_runclock(plans["llama-bf16"]))
        if "dense-15GiB" in plans:
            record("run-dense-15GiB", lambda: cell_run(plans["dense-15GiB"]))
            record("runclock-dense-15GiB", lambda: cell_runclock(plans["dense-15GiB"]))
        record("phases-llama-bf16", phases)
        if not a.no_torch:
            kinds = ["torch-hf", "torch-planc", "torch-state"]
            for kind in kinds if k % 2 == 0 else kinds[::-1]:
                record(kind, lambda kind=kind: _child(kind, llama, plans["llama-bf16"]))
            record("safetensors", lambda: _child("safetensors", llama))
    summary = {name: {key: statistics.median([r[key] for r in rs if isinstance(r.get(key), (int, float))])
                      for key in rs[0] if isinstance(rs[0][key], (int, float)) and key != "time"}
               for name, rs in rows.items()}
    if rows.get("torch-hf") and rows.get("torch-planc"):  # each round's pair, run side by side
        summary["torch-ratios"] = [round(p["ready_s"] / h["ready_s"], 3)
                                   for p, h in zip(rows["torch-planc"], rows["torch-hf"])]
        print("torch: planc.load_into / from_pretrained, round by round:", summary["torch-ratios"])
    (out / "startup.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_tables(summary)
    return 0


def print_tables(s: dict) -> None:
    def g(cell, key):
        v = s.get(cell, {}).get(key)
        return "—" if v is None else f"{v:.3f}"

    print("\n| what | process wall s | load s | outside the load s | prepare s |")
    print("|---|---|---|---|---|")
    for cell in ("run-llama-bf16", "run-dense-15GiB", "run-pyc-llama-bf16", "run-pyc-dense-15GiB", "first", "later"):
        if cell in s:
            print(f"| `planc run` {cell} | {g(cell, 'process_s')} | {g(cell, 'load_s')} | {g(cell, 'outside_s')} | "
                  f"{g(cell, 'prepare_s')} |")
    if "first" in s and "later" in s:
        print(f"\nfirst load on a new machine / later: {s['first']['load_s'] / s['later']['load_s']:.2f} (load), "
              f"{s['first']['process_s'] / s['later']['process_s']:.2f} (process); host growth / predicted: "
              f"first {s['first']['growth_over_predicted']:.3f}, later {s['later']['growth_over_predicted']:.3f}")
    p = s.get("phases-llama-bf16")
    if p:
        print("\nphases (2.2 GB bf16 plan, s): " + ", ".join(f"{k} {v:.3f}" for k, v in p.items()))
    if "torch-hf" in s and "torch-planc" in s:
        hf, pl = s["torch-hf"]["ready_s"], s["torch-planc"]["ready_s"]
        print(f"\nin a torch process, to a ready module: from_pretrained {hf:.3f} s, planc.load_into {pl:.3f} s "
              f"({pl / hf:.2f}x); planc.load().state_dict() {g('torch-state', 'ready_s')} s")
    if "safetensors" in s:
        print(f"safetensors load_file(device='cuda'): process {g('safetensors', 'process_s')} s, "
              f"load {g('safetensors', 'load_s')} s")


if __name__ == "__main__":
    raise SystemExit(main())
