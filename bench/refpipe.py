"""The reference pipeline: a plain reader -> pinned ring -> device copy, with no planning, built to be
the fastest this host allows. What planc's per-load overhead is measured against (issue 41, item 1).

    python3 bench/refpipe.py CKPT_DIR_OR_FILES... OUT --modes read,copy,both --repeat 3
                             [--threads 16] [--slot 16MiB] [--slots 32] [--verify]

The pipeline: `--threads` reader threads `os.preadv` (the GIL released) slot-sized slices of the files
into the slots of one pinned ring (`--slots` x `--slot`, allocated, pinned and touched once before
the clock starts, with the files opened and one CUDA event per slot created); one dedicated thread
takes the reads in the order they complete (no waiting on the oldest) and issues each one's
host-to-device copy on one CUDA stream, records the slot's event and hands the slot back; a reader
that takes a slot waits for that slot's event first, so a slot is refilled only after its copy is
done. The device destination is one `torch.empty` per file (allocated inside the clock, as a loader
must); it is freed after the clock stops.

Modes, each measured in a fresh process, alternating (rep 1 of every mode, then rep 2, ...), the page
cache warmed first (every file read once, again before a run if pages went missing):
  read  the readers into the ring only, no device (a plain numpy ring when torch or CUDA is missing)
  copy  the device copies alone: as many bytes as the files hold, slot by slot, from a ring filled
        before the clock (no reads)
  both  the full pipeline
A mode may name its own slot size: `both@64MiB`. OUT/refpipe.json holds every run and the medians;
each run also goes to OUT/refpipe.jsonl as it finishes. `--verify` compares the device bytes of the
first `both` run of each slot size with the files (after its clock); `--verify-read` adds an untimed
`read` run per slot size that hashes every slice as it lands and compares with the files.

The same `both` pipeline is the loader `reference` of bench/loaders.py (threads, slot and slots from
REFPIPE_THREADS, REFPIPE_SLOT, REFPIPE_SLOTS), so bench/peers.py times it beside planc.

REFPIPE_PIN chooses how the ring is pinned: `torch` (the default, `pin_memory=True`), or as planc
pins its ring (`register`: huge pages registered with the driver; `alloc`: `cuMemHostAlloc`), so
that one call compares the copies out of each (`--loaders reference,reference@REFPIPE_PIN=register`
in bench/peers.py, or this script's `copy` mode under each).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstatus import status as _status  # noqa: E402  (the process's VmRSS / VmHWM, as every loader's)

import numpy as np

MODES = ("read", "copy", "both")
THREADS, SLOT, SLOTS = 16, 16 << 20, 32
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text) -> int:
    """`16MiB`, `64M`, `1GiB`, `4096` -> bytes (binary units; KB/MB/GB are decimal)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a byte size like 16MiB or 4096, got {text!r}")
    n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if n <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return n


def fmt_size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k}{unit}"
    return str(n)


def files_of(paths) -> list[str]:
    """The files to load: each path a file, or a folder whose *.safetensors are taken (sorted)."""
    out: list[str] = []
    for p in paths:
        p = str(p)
        if os.path.isdir(p):
            out += sorted(glob.glob(os.path.join(p, "*.safetensors")))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    if not out:
        raise FileNotFoundError(f"no *.safetensors files in {', '.join(map(str, paths))}")
    return out


def chunks_of(sizes: list[int], slot: int) -> list[tuple[int, int, int]]:
    """(file index, offset, length) of every slot-sized slice, file by file, in offset order."""
    return [(i, off, min(slot, size - off)) for i, size in enumerate(sizes) for off in range(0, size, slot)]


# -- devices: the pinned ring and the copies ------------------------------------------------------
class HostOnly:
    """No device: a plain numpy ring (not pinned), for `read` where torch or CUDA is missing."""

    name = "numpy"
    has_device = False

    def __init__(self, ring_bytes: int, why: str):
        self.ring = np.ones(ring_bytes, dtype=np.uint8)  # touched: no page faults on the clock
        self.note = f"ring in plain host memory, not pinned ({why})"

    def info(self) -> dict:
        return {"device": "none", "ring": self.note}


class TorchDevice:
    """The ring: one pinned torch buffer (`pin_memory=True`), sliced; copies on one CUDA stream."""

    name = "torch"
    has_device = True

    def __init__(self, ring_bytes: int):
        import torch

        self.torch = torch
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the context
        how = os.environ.get("REFPIPE_PIN", "torch")
        if how == "torch":
            self.ring_t = torch.empty(ring_bytes, dtype=torch.uint8, pin_memory=True)
            self.note = "ring pinned by torch (pin_memory=True)"
        elif how in ("register", "alloc"):  # planc's ring: huge pages registered, or cuMemHostAlloc
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
            from planc.execute.device import driver

            self._owner = driver.pinned_array(ring_bytes, how)  # in torch's (the primary) context
            self.ring_t = torch.from_numpy(self._owner)
            self.note = f"ring pinned as planc pins it (PLANC_PIN={how}), as a torch tensor"
        else:
            raise SystemExit(f"REFPIPE_PIN: {how!r} is not one of torch, register, alloc")
        self.ring = self.ring_t.numpy()  # the same memory, for preadv
        self.ring.fill(1)  # touched before the clock
        self.stream = torch.cuda.Stream()
        n = min(ring_bytes, 1 << 20)  # one small copy on the stream before the clock: first-use costs
        d = torch.empty(n, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(self.stream):
            d.copy_(self.ring_t[:n], non_blocking=True)
        self.stream.synchronize()
        del d

    def info(self) -> dict:
        t = self.torch
        return {"device": t.cuda.get_device_name(0), "torch": t.__version__, "cuda": t.version.cuda,
                "ring": self.note, "ring_pinned": bool(self.ring_t.is_pinned())}

    def events(self, k: int) -> list:
        evs = [self.torch.cuda.Event() for _ in range(k)]
        for e in evs:  # created (recorded once) before the clock
            e.record(self.stream)
        self.stream.synchronize()
        return evs

    def context(self):
        return self.torch.cuda.stream(self.stream)  # the issuing thread's current stream

    def alloc(self, n: int):
        return self.torch.empty(n, dtype=self.torch.uint8, device="cuda")

    def issue(self, dst, doff: int, roff: int, n: int, ev) -> None:
        """Copy ring[roff:roff+n] to dst[doff:doff+n] on the stream, then record `ev` after it (the
        caller is inside `context()`)."""
        dst[doff:doff + n].copy_(self.ring_t[roff:roff + n], non_blocking=True)
        ev.record(self.stream)

    def wait(self, ev) -> None:
        ev.synchronize()

    def mark(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        return e

    def elapsed(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3  # milliseconds -> seconds

    def sync(self) -> None:
        self.stream.synchronize()
        self.torch.cuda.synchronize()

    def to_host(self, dst, off: int, n: int) -> np.ndarray:
        return dst[off:off + n].cpu().numpy()


class _SimEvent:
    def __init__(self):
        self.done = threading.Event()
        self.done.set()
        self.t = 0.0


class SimDevice:
    """A stand-in for the GPU, for tests without one: copies run in order on a thread of their own
    (an asynchronous stream), after `delay` seconds each, and events are set when the copies before
    them are done; a slot refilled before its copy ran would show in `--verify`."""

    name = "sim"
    has_device = True

    def __init__(self, ring_bytes: int, delay: float = 0.0005):
        self.ring = np.ones(ring_bytes, dtype=np.uint8)
        self.delay = delay
        self.q: queue.Queue = queue.Queue()
        self.note = "simulated device: copies on a thread"
        threading.Thread(target=self._stream, daemon=True).start()

    def _stream(self) -> None:
        while True:
            op = self.q.get()
            try:
                if op[0] == "copy":
                    _, dst, doff, roff, n = op
                    time.sleep(self.delay)
                    dst[doff:doff + n] = self.ring[roff:roff + n]
                else:
                    op[1].t = time.perf_counter()
                    op[1].done.set()
            finally:
                self.q.task_done()

    def info(self) -> dict:
        return {"device": "sim", "ring": self.note}

    def events(self, k: int) -> list:
        return [_SimEvent() for _ in range(k)]

    def context(self):
        import contextlib

        return contextlib.nullcontext()

    def alloc(self, n: int):
        return np.full(n, 0xAA, dtype=np.uint8)

    def issue(self, dst, doff: int, roff: int, n: int, ev) -> None:
        self.q.put(("copy", dst, doff, roff, n))
        ev.done.clear()
        self.q.put(("event", ev))

    def wait(self, ev) -> None:
        ev.done.wait()

    def mark(self):
        ev = _SimEvent()
        ev.done.clear()
        self.q.put(("event", ev))
        return ev

    def elapsed(self, a, b) -> float:
        a.done.wait()
        b.done.wait()
        return b.t - a.t

    def sync(self) -> None:
        self.q.join()

    def to_host(self, dst, off: int, n: int) -> np.ndarray:
        return dst[off:off + n]


def make_device(kind: str, mode: str, ring_bytes: int):
    """`auto`: torch with CUDA; for `read` without them, a plain numpy ring (said in the result)."""
    if kind == "sim":
        return SimDevice(ring_bytes)
    if kind == "none":
        return HostOnly(ring_bytes, "asked for")
    why = None
    try:
        import torch

        if not torch.cuda.is_available():
            why = "torch.cuda is not available"
    except ImportError:
        why = "torch is missing"
    if why is None:
        return TorchDevice(ring_bytes)
    if mode == "read" and kind == "auto":
        return HostOnly(ring_bytes, why)
    raise RuntimeError(f"mode {mode} needs a CUDA device: {why}")


# -- the pipeline ---------------------------------------------------------------------------------
class Pipeline:
    """Everything a load needs that does not depend on the clock: the files opened, the slices
    listed, the ring allocated, pinned and touched, one event per slot."""

    def __init__(self, files, threads: int = THREADS, slot: int = SLOT, slots: int = SLOTS,
                 device: str = "auto", mode: str = "both"):
        t0 = time.perf_counter()
        if threads < 1 or slots < 1 or slot < 1:
            raise ValueError(f"threads, slots and slot must be positive: {threads}, {slots}, {slot}")
        self.files = [str(f) for f in files]
        self.sizes = [os.path.getsize(f) for f in self.files]
        self.nbytes = sum(self.sizes)
        self.threads, self.slot, self.slots = threads, slot, slots
        self.jobs = chunks_of(self.sizes, slot)
        self.fds = [os.open(f, os.O_RDONLY) for f in self.files]
        self.dev = make_device(device, mode, slot * slots)
        ring = self.dev.ring
        self.views = [memoryview(ring[s * slot:(s + 1) * slot]) for s in range(slots)]
        self.events = self.dev.events(slots) if self.dev.has_device else [None] * slots
        self.keep = None  # the last load's device buffers, freed off the clock (`release`)
        self.setup_seconds = time.perf_counter() - t0

    def close(self) -> None:
        self.release()
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def release(self) -> None:
        self.keep = None

    def _base(self, mode: str) -> dict:
        return {"mode": mode, "threads": self.threads, "slot": self.slot, "slots": self.slots,
                "bytes": self.nbytes, "files": len(self.files), "chunks": len(self.jobs),
                "pinned_bytes": self.slot * self.slots if self.dev.name == "torch" else 0,
                "setup_seconds": self.setup_seconds, **self.dev.info()}

    def _stream(self, dsts, digests: list | None = None) -> dict:
        """Readers into the ring, one consumer in completion order: with `dsts`, it issues each
        slice's copy and hands its slot back behind the slot's event; without, it hands it back (after
        hashing the slice into `digests[i]` when asked: the check of `read`, which slows it)."""
        dev, jobs, views, events, fds = self.dev, self.jobs, self.views, self.events, self.fds
        slot, njobs = self.slot, len(self.jobs)
        free: queue.SimpleQueue = queue.SimpleQueue()
        for s in range(self.slots):
            free.put(s)
        done: queue.SimpleQueue = queue.SimpleQueue()
        lock = threading.Lock()
        nxt = [0]
        abort = threading.Event()
        errors: list = []
        rstats: list = []
        cstats: dict = {}
        t0 = time.perf_counter()

        def reader() -> None:
            busy = wait = 0.0
            count = 0
            try:
                while not abort.is_set():
                    with lock:
                        i = nxt[0]
                        nxt[0] += 1
                    if i >= njobs:
                        break
                    ta = time.perf_counter()
                    s = free.get()
                    if s < 0:
                        break
                    if events[s] is not None:
                        dev.wait(events[s])
                    tb = time.perf_counter()
                    f, off, n = jobs[i]
                    mv = views[s]
                    got = 0
                    while got < n:
                        k = os.preadv(fds[f], [mv[got:n]], off + got)
                        if k <= 0:
                            raise EOFError(f"{self.files[f]}: read returned {k} at {off + got} (file shorter?)")
                        got += k
                    busy += time.perf_counter() - tb
                    wait += tb - ta
                    count += 1
                    done.put((i, s))
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                errors.append(e)
                abort.set()
                done.put(None)
            finally:
                rstats.append((busy, wait, count))

        def consumer() -> None:
            wait = issue = 0.0
            try:
                with dev.context() if dsts is not None else _null():
                    for c in range(njobs):
                        ta = time.perf_counter()
                        item = done.get()
                        tb = time.perf_counter()
                        wait += tb - ta
                        if item is None:
                            return
                        i, s = item
                        if c == 0:
                            cstats["first_read_seconds"] = tb - t0
                        if digests is not None:
                            digests[i] = hashlib.blake2b(views[s][:jobs[i][2]]).digest()
                        if dsts is not None:
                            f, off, n = jobs[i]
                            dev.issue(dsts[f], off, s * slot, n, events[s])
                            if c == 0:
                                cstats["first_mark"] = dev.mark()
                        free.put(s)
                        issue += time.perf_counter() - tb
                    if dsts is not None:
                        dev.sync()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                abort.set()
            finally:
                cstats.update(consumer_wait_seconds=wait, issue_seconds=issue)
                if abort.is_set():
                    for _ in range(self.threads):
                        free.put(-1)

        pool = [threading.Thread(target=reader, daemon=True, name=f"refpipe-read-{k}") for k in range(self.threads)]
        pool.append(threading.Thread(target=consumer, daemon=True, name="refpipe-copy"))
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        return {"read_busy_seconds": sum(r[0] for r in rstats), "read_slot_wait_seconds": sum(r[1] for r in rstats),
                "reads": sum(r[2] for r in rstats), **cstats}

    def run_read(self, check: bool = False) -> dict:
        """The readers alone. `check`: hash every slice as it lands (slower) and compare with the files."""
        digests = [b""] * len(self.jobs) if check else None
        t0 = time.perf_counter()
        st = self._stream(None, digests)
        wall = time.perf_counter() - t0
        out = {**self._base("read"), **st, "wall_seconds": wall, "gb_per_s": self.nbytes / wall / 1e9}
        if check:
            want = [hashlib.blake2b(os.pread(self.fds[f], n, off)).digest() for f, off, n in self.jobs]
            got, exp = hashlib.blake2b(b"".join(digests)).hexdigest()[:32], hashlib.blake2b(b"".join(want)).hexdigest()[:32]
            bad = [self.jobs[i] for i in range(len(want)) if want[i] != digests[i]]
            out.update(verify="ok" if not bad else f"MISMATCH: {self.files[bad[0][0]]} at byte {bad[0][1]} "
                       f"({len(bad)} slices)", verify_hash=got, file_hash=exp)
        return out

    def run_both(self) -> dict:
        if not self.dev.has_device:
            raise RuntimeError("mode both needs a device")
        dev = self.dev
        t0 = time.perf_counter()
        start = dev.mark()
        dsts = [dev.alloc(n) for n in self.sizes]
        alloc = time.perf_counter() - t0
        st = self._stream(dsts)
        dev.sync()
        wall = time.perf_counter() - t0
        self.keep = dsts
        first = st.pop("first_mark", None)
        out = {**self._base("both"), **st, "wall_seconds": wall, "gb_per_s": self.nbytes / wall / 1e9,
               "alloc_seconds": alloc, "pipe_gb_per_s": self.nbytes / max(wall - alloc, 1e-9) / 1e9}
        if first is not None:
            out["ttfb_seconds"] = dev.elapsed(start, first)
        return out

    def run_copy(self) -> dict:
        """The copies alone, from the ring filled before the clock: slice k from slot k % slots."""
        if not self.dev.has_device:
            raise RuntimeError("mode copy needs a device")
        dev, slot = self.dev, self.slot
        t0 = time.perf_counter()
        start = dev.mark()
        dsts = [dev.alloc(n) for n in self.sizes]
        alloc = time.perf_counter() - t0
        first = None
        with dev.context():
            for c, (f, off, n) in enumerate(self.jobs):
                s = c % self.slots
                dev.issue(dsts[f], off, s * slot, n, self.events[s])
                if c == 0:
                    first = dev.mark()
            issued = time.perf_counter() - t0 - alloc
        dev.sync()
        wall = time.perf_counter() - t0
        self.keep = dsts
        out = {**self._base("copy"), "wall_seconds": wall, "gb_per_s": self.nbytes / wall / 1e9,
               "alloc_seconds": alloc, "issue_seconds": issued,
               "pipe_gb_per_s": self.nbytes / max(wall - alloc, 1e-9) / 1e9}
        if first is not None:
            out["ttfb_seconds"] = dev.elapsed(start, first)
        return out

    def run(self, mode: str, check: bool = False) -> dict:
        if mode == "read":
            return self.run_read(check)
        return {"copy": self.run_copy, "both": self.run_both}[mode]()

    def verify(self) -> dict:
        """The last load's device bytes against the files, 64 MiB at a time (off the clock)."""
        if self.keep is None:
            return {"verify": "nothing loaded"}
        step = 64 << 20
        t = time.perf_counter()
        for f, (fd, size, dst) in enumerate(zip(self.fds, self.sizes, self.keep)):
            for off in range(0, size, step):
                n = min(step, size - off)
                a = np.ascontiguousarray(self.dev.to_host(dst, off, n))
                b = np.frombuffer(os.pread(fd, n, off), dtype=np.uint8)
                if a.shape != b.shape or not np.array_equal(a, b):
                    bad = int(np.flatnonzero(a != b)[0]) if a.shape == b.shape else 0
                    return {"verify": f"MISMATCH: {self.files[f]} at byte {off + bad}"}
        return {"verify": "ok", "verify_bytes": self.nbytes, "verify_seconds": time.perf_counter() - t}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


# -- the loader `reference` (bench/loaders.py) ----------------------------------------------------
def loader_setup(files, spec=None) -> Pipeline:
    """Outside the clock: CUDA context, files opened, ring pinned, events created."""
    return Pipeline(files, threads=int(os.environ.get("REFPIPE_THREADS", THREADS)),
                    slot=parse_size(os.environ.get("REFPIPE_SLOT", SLOT)),
                    slots=int(os.environ.get("REFPIPE_SLOTS", SLOTS)), device="auto", mode="both")


def loader_run(files, pipe: Pipeline) -> dict:
    r = pipe.run_both()  # the device buffers stay on `pipe` (freed when the process ends, off the clock)
    keys = ("threads", "slot", "slots", "chunks", "pinned_bytes", "setup_seconds", "alloc_seconds",
            "ttfb_seconds", "first_read_seconds", "read_busy_seconds", "read_slot_wait_seconds",
            "consumer_wait_seconds", "issue_seconds", "device")
    return {"bytes": r["bytes"], "inner_seconds": r["wall_seconds"], "inner_gb_per_s": r["gb_per_s"],
            **{k: r[k] for k in keys if k in r}}


# -- one measurement per process ------------------------------------------------------------------
def child(cfg: dict) -> dict:
    """Run one mode in this process; the result as a dict (printed as one JSON line by main)."""
    pipe = Pipeline(cfg["files"], cfg["threads"], cfg["slot"], cfg["slots"], cfg.get("device", "auto"), cfg["mode"])
    base = _status("VmRSS")
    r = pipe.run(cfg["mode"], check=bool(cfg.get("verify")))
    r.update(hwm_bytes=_status("VmHWM"), baseline_rss_bytes=base)
    if cfg.get("verify") and cfg["mode"] == "both":
        r.update(pipe.verify())
    t = time.perf_counter()
    pipe.close()
    r["free_seconds"] = time.perf_counter() - t
    return r


def one(cfg: dict, timeout: int = 300) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": cfg["mode"], "slot": cfg["slot"], "error": f"timed out after {timeout} s"}
    lines = [x for x in p.stdout.strip().splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": cfg["mode"], "slot": cfg["slot"], "error": (p.stderr or p.stdout)[-1500:] or f"rc {p.returncode}"}
    return json.loads(lines[-1])


def resident(path: str) -> float | None:
    try:
        from planc.execute.io.reader import page_cache_fraction
    except Exception:  # noqa: BLE001 - planc not importable: unknown
        return None
    return page_cache_fraction(path, os.path.getsize(path))


def warm(files, force: bool) -> float:
    """Read every file (forced) or every file whose sampled pages are not all resident; seconds."""
    t = time.perf_counter()
    for f in files:
        if not force:
            frac = resident(f)
            if frac is None or frac >= 0.999:
                continue
        with open(f, "rb", buffering=0) as h:
            while h.read(64 << 20):
                pass
    return time.perf_counter() - t


def parse_modes(text: str, slot: int) -> list[tuple[str, int]]:
    """`read,copy,both,both@64MiB` -> [(mode, slot)], in order, without repeats."""
    out: list[tuple[str, int]] = []
    for tok in (x.strip() for x in text.split(",")):
        if not tok:
            continue
        mode, _, size = tok.partition("@")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)}, each optionally @SLOT)")
        key = (mode, parse_size(size) if size else slot)
        if key not in out:
            out.append(key)
    if not out:
        raise ValueError("no modes")
    return out


def label(mode: str, slot: int) -> str:
    return f"{mode}@{fmt_size(slot)}"


def medians(runs: list[dict]) -> dict:
    out: dict = {}
    groups: dict = {}
    for r in runs:
        if r.get("check"):
            continue
        groups.setdefault(label(r["mode"], r["slot"]), []).append(r)
    for key, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        m: dict = {"n": len(ok), "errors": len(rs) - len(ok)}
        for k in ("gb_per_s", "pipe_gb_per_s", "wall_seconds", "ttfb_seconds", "first_read_seconds", "alloc_seconds",
                  "read_busy_seconds", "read_slot_wait_seconds", "consumer_wait_seconds", "issue_seconds"):
            vals = [r[k] for r in ok if r.get(k) is not None]
            if vals:
                m[k] = statistics.median(vals)
                if k == "gb_per_s":
                    m["gb_per_s_runs"] = [round(v, 3) for v in vals]
        if ok:
            m["hwm_growth_bytes"] = statistics.median(r["hwm_bytes"] - r["baseline_rss_bytes"] for r in ok)
            m["ring"] = ok[0].get("ring")
            m["device"] = ok[0].get("device")
        out[key] = m
    return out


def analysis(med: dict, slots: list[int]) -> list[str]:
    """Per slot size: read alone, copy alone, both; the serial bound 1/(1/read + 1/copy)."""
    lines = []
    for slot in slots:
        g = {m: med.get(label(m, slot), {}).get("gb_per_s") for m in MODES}
        if g["both"] and g["read"] and g["copy"]:
            serial = 1 / (1 / g["read"] + 1 / g["copy"])
            lines.append(f"  slot {fmt_size(slot)}: read {g['read']:.2f}, copy {g['copy']:.2f}, both {g['both']:.2f} GB/s;"
                         f" both / min(read, copy) = {g['both'] / min(g['read'], g['copy']):.2f},"
                         f" both / serial bound {serial:.2f} = {g['both'] / serial:.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="checkpoint folder(s) or files, then OUT (the last path)")
    ap.add_argument("--modes", default="read,copy,both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--slot", default=fmt_size(SLOT))
    ap.add_argument("--slots", type=int, default=SLOTS)
    ap.add_argument("--verify", action="store_true",
                    help="compare the device bytes of each slot size's first `both` run with the files (after its clock)")
    ap.add_argument("--verify-read", action="store_true",
                    help="one more `read` run per slot size, untimed, hashing every slice as it lands against the files")
    ap.add_argument("--device", default="auto", choices=["auto", "torch", "none", "sim"],
                    help="auto: torch with CUDA (read mode falls back to a numpy ring); sim: a simulated device (tests)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per measurement process")
    a = ap.parse_args(argv)
    if len(a.paths) < 2:
        ap.error("give the checkpoint (folder or files) and OUT")
    if a.repeat < 1 or a.threads < 1 or a.slots < 1:
        ap.error("--repeat, --threads and --slots must be at least 1")
    try:
        slot = parse_size(a.slot)
        configs = parse_modes(a.modes, slot)
        files = files_of(a.paths[:-1])
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))
    out = Path(a.paths[-1])
    out.mkdir(parents=True, exist_ok=True)
    nbytes = sum(os.path.getsize(f) for f in files)
    print(f"refpipe: {len(files)} files, {nbytes / 2**30:.2f} GiB; threads {a.threads}, slots {a.slots}; "
          f"{', '.join(label(m, s) for m, s in configs)} x {a.repeat}", flush=True)
    print(f"  page cache warmed in {warm(files, force=True):.1f} s", flush=True)
    log = (out / "refpipe.jsonl").open("a")
    runs: list[dict] = []
    verified: set = set()
    doc = {"files": files, "bytes": nbytes, "threads": a.threads, "slots": a.slots, "repeat": a.repeat,
           "configs": [label(m, s) for m, s in configs], "host_cpus": os.cpu_count(), "runs": runs}
    plan = [(-1, m, s) for m, s in configs if m == "read" and a.verify_read]  # untimed: hashing slows them
    plan += [(rep, m, s) for rep in range(a.repeat) for m, s in configs]
    for rep, mode, s in plan:
        warm(files, force=False)
        check = rep < 0 or (a.verify and mode == "both" and s not in verified)
        cfg = {"files": files, "mode": mode, "threads": a.threads, "slot": s, "slots": a.slots, "device": a.device,
               "verify": check}
        r = one(cfg, a.timeout)
        r.update(rep=rep, time=time.time(), mode=mode, slot=s, check=rep < 0)
        if check and mode == "both":
            verified.add(s)
        runs.append(r)
        log.write(json.dumps(r) + "\n")
        log.flush()
        tag = "check" if rep < 0 else rep
        if "error" in r:
            last = [x for x in r["error"].strip().splitlines() if x.strip()][-3:]
            print(f"  [{tag}] {label(mode, s):16s} ERROR " + " | ".join(x.strip() for x in last), flush=True)
        else:
            extra = "".join(f", {k.split('_')[0]} {r[k] * 1e3:.1f} ms" for k in ("ttfb_seconds", "alloc_seconds")
                            if r.get(k) is not None)
            ver = f", verify {r['verify']}" if "verify" in r else ""
            print(f"  [{tag}] {label(mode, s):16s} {r['gb_per_s']:7.2f} GB/s  {r['wall_seconds']:.3f} s"
                  f"{extra}{ver}  ({r.get('device')}; {r.get('ring')})", flush=True)
        doc["medians"] = medians(runs)
        (out / "refpipe.json").write_text(json.dumps(doc, indent=1))
    med = medians(runs)
    doc["medians"] = med
    doc["analysis"] = analysis(med, sorted({s for _, s in configs}))
    (out / "refpipe.json").write_text(json.dumps(doc, indent=1))
    print(f"== refpipe medians ({nbytes / 1e9:.2f} GB)", flush=True)
    for key, m in med.items():
        if not m["n"]:
            print(f"  {key:16s} no successful run ({m['errors']} errors)", flush=True)
            continue
        parts = [f"{m['gb_per_s']:7.2f} GB/s", f"wall {m['wall_seconds']:.3f} s"]
        for k, name in (("ttfb_seconds", "ttfb"), ("alloc_seconds", "alloc"), ("first_read_seconds", "first read")):
            if k in m:
                parts.append(f"{name} {m[k] * 1e3:.1f} ms")
        if "read_busy_seconds" in m:
            parts.append(f"readers busy {m['read_busy_seconds']:.2f} s, waiting for slots {m['read_slot_wait_seconds']:.2f} s")
        if "consumer_wait_seconds" in m:
            parts.append(f"consumer waiting {m['consumer_wait_seconds']:.2f} s")
        parts.append(f"growth {m['hwm_growth_bytes'] / 2**20:.0f} MiB (n={m['n']})")
        print(f"  {key:16s} " + ", ".join(parts), flush=True)
    for line in doc["analysis"]:
        print(line, flush=True)
    bad = [r for r in runs if str(r.get("verify", "ok")) != "ok" and "verify" in r]
    return 1 if bad or all("error" in r for r in runs) else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))), flush=True)
        sys.exit(0)
    sys.exit(main())
