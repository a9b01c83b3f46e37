"""One load per process: `python3 bench/loaders.py LOADER CKPT_DIR [SPEC]` prints one JSON line.

Every loader is timed the same way: CUDA context created first (baseline RSS read then), the clock
starts, the whole checkpoint goes to the GPU, the device is synchronized, the clock stops; peak RSS
is the process's VmHWM (ru_maxrss is inherited across fork/exec and would lie).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from pathlib import Path


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procstatus import status as _status  # noqa: E402


def files_of(ckpt: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))


def main() -> None:
    loader, ckpt = sys.argv[1], sys.argv[2]
    spec = sys.argv[3] if len(sys.argv) > 3 else None
    files = files_of(ckpt)
    nbytes = sum(os.path.getsize(f) for f in files)
    fn, setup = LOADERS[loader]
    ctx = setup(files, spec)
    base = _status("VmRSS")
    t0 = time.perf_counter()
    extra = fn(files, ctx) or {}
    wall = time.perf_counter() - t0
    out = {"loader": loader, "wall_seconds": wall, "bytes": extra.pop("bytes", nbytes),
           "hwm_bytes": _status("VmHWM"), "baseline_rss_bytes": base, **extra}
    out["gb_per_s"] = out["bytes"] / wall / 1e9
    print(json.dumps(out))


# -- torch-based peers ---------------------------------------------------------------------------
def _torch_setup(files, spec):
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    return None


def st_load_file(files, _):
    import torch
    from safetensors.torch import load_file

    keep = []
    for f in files:
        keep.append(load_file(f, device="cuda"))
    torch.cuda.synchronize()


def st_safe_open(files, _):
    import torch
    from safetensors import safe_open

    keep = {}
    for f in files:
        with safe_open(f, framework="pt", device="cuda") as h:
            for k in h.keys():
                keep[k] = h.get_tensor(k)
    torch.cuda.synchronize()


def _fst(direct: bool):
    def run(files, _):
        import torch

        os.environ["FASTSAFETENSORS_ODIRECT"] = "1" if direct else "0"
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        loader = SafeTensorsFileLoader(SingleGroup(), "cuda:0", nogds=True)
        loader.add_filenames({0: files})
        fb = loader.copy_files_to_device()
        keep = {k: fb.get_tensor(k) for k in list(fb.key_to_rank_lidx.keys())}
        torch.cuda.synchronize()
        n = sum(t.numel() * t.element_size() for t in keep.values())
        fb.close()
        loader.close()
        return {"bytes_tensors": n}
    return run


def runai(files, _):
    import torch
    from runai_model_streamer import SafetensorsStreamer

    keep = {}
    with SafetensorsStreamer() as s:
        s.stream_files(files) if hasattr(s, "stream_files") else [s.stream_file(f) for f in files]
        for name, t in s.get_tensors():
            keep[name] = t.to("cuda", non_blocking=False)
    torch.cuda.synchronize()


def pinned_copy(files, _):
    """Ceiling: the pinned host->device copy rate (the link), 1 GiB buffer, 8 copies."""
    import torch

    n = 1 << 30
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    h.fill_(1)
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(8):
        d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"bytes": 8 * n, "inner_seconds": dt, "inner_gb_per_s": 8 * n / dt / 1e9}


def _plain(direct: bool, threads: int, slot: int = 64 << 20, nslots: int = 16):
    """Ceiling: N reader threads preadv whole slots into pinned buffers, async copies on one stream."""
    def run(files, _):
        import torch

        flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
        fds = {f: os.open(f, flags) for f in files}
        jobs = []
        dsts = {}
        for f in files:
            size = os.path.getsize(f)
            dsts[f] = torch.empty(size, dtype=torch.uint8, device="cuda")
            for off in range(0, size, slot):
                jobs.append((f, off, min(slot, size - off)))
        bufs = [torch.empty(slot, dtype=torch.uint8, pin_memory=True) for _ in range(nslots)]
        free = list(range(nslots))
        events = [None] * nslots
        stream = torch.cuda.Stream()
        import concurrent.futures as cf

        def read(job, b):
            f, off, n = job
            mv = memoryview(bufs[b].numpy())
            rlen = -(-n // 4096) * 4096 if direct else n
            got = 0
            while got < n:
                k = os.preadv(fds[f], [mv[got:rlen]], off + got)
                if k == 0:
                    break
                got += k
            return job, b

        pending = []
        with cf.ThreadPoolExecutor(threads) as pool:
            it = iter(jobs)
            done = False
            while not done or pending:
                while not done and free:
                    job = next(it, None)
                    if job is None:
                        done = True
                        break
                    b = free.pop()
                    if events[b] is not None:
                        events[b].synchronize()
                    pending.append(pool.submit(read, job, b))
                if pending:
                    (f, off, n), b = pending.pop(0).result()
                    with torch.cuda.stream(stream):
                        dsts[f][off:off + n].copy_(bufs[b][:n], non_blocking=True)
                        ev = torch.cuda.Event()
                        ev.record(stream)
                    events[b] = ev
                    free.append(b)
        stream.synchronize()
        for fd in fds.values():
            os.close(fd)
    return run


# -- the reference pipeline (bench/refpipe.py) -------------------------------------------------------
def _reference_setup(files, spec):
    """Outside the clock, as the pipeline's design has it: CUDA context, files opened, the pinned ring
    allocated and touched, one event per slot (REFPIPE_THREADS / REFPIPE_SLOT / REFPIPE_SLOTS)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import refpipe

    return refpipe.loader_setup(files, spec)


def reference_run(files, pipe):
    import refpipe

    return refpipe.loader_run(files, pipe)


# -- planc ---------------------------------------------------------------------------------------
def _planc_setup(files, spec):
    # PLANC_BENCH_ROOT: another tree's planc (an earlier commit's, `git archive C planc | tar -x -C DIR`)
    # for a side-by-side A/B in one call: `--loaders planc,planc@PLANC_BENCH_ROOT=DIR`
    sys.path.insert(0, os.environ.get("PLANC_BENCH_ROOT") or str(Path(__file__).resolve().parent.parent))
    from planc.compiler.compile import compile_spec
    from planc.execute.device import seam

    # PLANC_BENCH_IO=workers=12/slots=32: this variant's io settings, in a spec of its own ("/" between
    # settings: peers.py's loader list is split on ",")
    io = dict(kv.split("=", 1) for kv in os.environ.get("PLANC_BENCH_IO", "").split("/") if kv)
    if io:
        import tempfile

        import yaml

        doc = yaml.safe_load(Path(spec).read_text())
        doc.setdefault("io", {}).update({k: int(v) if v.isdigit() else v for k, v in io.items()})
        doc["checkpoint"] = str(Path(spec).parent / doc["checkpoint"])
        spec = Path(tempfile.mkdtemp()) / "spec.yaml"
        spec.write_text(yaml.safe_dump(doc))
    plan = compile_spec(spec)
    import planc

    if hasattr(planc, "warm_up"):  # outside the clock, as the reference's set-up: context, imports and,
        # with PLANC_RING=kept, the ring pinned
        return planc.warm_up(plan, ring=os.environ.get("PLANC_RING") == "kept")
    seam.select(plan.to_dict()["device"])
    seam.warm_up()
    import importlib

    for name in ("planc.plan.predict", "planc.execute.device.launch", "planc.execute.device.memory",
                 "planc.execute.pipeline.loader", "planc.execute.pipeline.meter", "planc.execute.pipeline.model",
                 "planc.execute.pipeline.parts", "planc.execute.pipeline.records"):  # what warm_up imports
        importlib.import_module(name)
    return plan


def planc_run(files, plan):
    from planc.execute import execute

    t0 = time.perf_counter()
    m = execute(plan)
    t1 = time.perf_counter()
    rep = m.report.as_json()
    m.free()
    t2 = time.perf_counter()
    return {"execute_seconds": t1 - t0, "free_seconds": t2 - t1,"bytes": rep["payload_bytes"], "requests": rep["requests"], "copies": rep["copies"],
            "kernels": rep["kernels"], "files": rep["files"], "report_seconds": rep["wall_seconds"],
            # Timed like the peers: until every tensor is on the device (freeing it is not part of a load).
            "inner_seconds": t1 - t0, "inner_gb_per_s": rep["payload_bytes"] / (t1 - t0) / 1e9,
            "planc_growth_bytes": rep["host"]["growth_bytes"], "pinned_bytes": rep["host"]["pinned_bytes"],
            "timings": rep.get("timings"),
            "predicted_host_peak_bytes": rep["host"]["predicted_peak_bytes"]}


LOADERS = {
    "planc": (planc_run, _planc_setup),
    "st_load_file": (st_load_file, _torch_setup),
    "st_safe_open": (st_safe_open, _torch_setup),
    "fastsafetensors": (_fst(False), _torch_setup),
    "fastsafetensors_direct": (_fst(True), _torch_setup),
    "runai": (runai, _torch_setup),
    "pinned_copy": (pinned_copy, _torch_setup),
    "plain_warm": (_plain(False, 16), _torch_setup),
    "plain_direct": (_plain(True, 8), _torch_setup),
    "reference": (reference_run, _reference_setup),
}

if __name__ == "__main__":
    main()
