"""Faults during a real load on a GPU (marked `gpu`): fail clean, and give every byte back.

Run this file alone, in a process where the CUDA simulator is off:

    python -m pytest -m gpu -p no:cacheprovider -o addopts="" tests/test_faults_gpu.py

It skips itself when NUMBA_ENABLE_CUDASIM is set and when no GPU is present, as
tests/test_execute_gpu.py does. These are tests/test_hostile.py's sections 3 and 4 on a real
device, with small real checkpoints (16-32 MiB; 1.5 GiB for SIGINT), and with what the simulator
cannot show: device memory and pinned host memory.

1. Each fault (a shard truncated, replaced or removed after compile, or truncated during the load;
   a read failing with EIO; KeyboardInterrupt inside the pipeline; live room shrinking below a
   later run's cost; a file system refusing O_DIRECT) ends in its typed error and exit code, through
   the API and through `planc run` in-process. With the error still held, device free memory is
   back to its value before the load (within 2 MiB), pinned host memory is back to the byte, the
   ring and arena objects are gone, and no reader thread or checkpoint file descriptor is left.
2. SIGINT to `python -m planc run --json` while it loads: exit 130, one line on stderr.
3. 100 load/free cycles of a plan with kernels (fuse, stack through the scatter kernel, BF16 -> F16
   in place, BF16 -> F32, a transpose) and plain copies: from cycle 10 to cycle 100 RSS grows at
   most 8 MiB, pinned memory not at all, device memory at most 2 MiB.

The figures are printed (`-s` shows them) and appended as JSON lines to $PLANC_FAULTS_LOG when set.

How pinned host memory is counted. /proc/self/status is no exact count: the NVIDIA driver pins
pages itself, not through mlock (VmLck) nor, as far as is known, with pinned_vm accounting (VmPin);
cuMemHostAlloc memory has been reported under RssShmem, among other shared memory. So
`PinnedLedger` counts at the driver boundary: it wraps the functions of the executor's own driver
binding (`planc.execute.device.driver.lib()`: cuMemHostAlloc / cuMemFreeHost, and cuMemHostRegister /
cuMemHostUnregister should the ring ever be registered instead), from every thread, for the whole
module, and keeps {address: bytes} of what is pinned now. Each check also asks the driver itself (cuMemHostGetFlags,
cuPointerGetAttribute) that no address the ledger saw given back is still page-locked. RssShmem,
VmLck, VmPin and the bytes mapped from /dev/nvidia* are recorded beside it, as operating-system
views to compare with.
"""

import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip("the CUDA simulator is on in this process; run this file alone, without NUMBA_ENABLE_CUDASIM",
                allow_module_level=True)

import numba  # noqa: E402
from numba import cuda  # noqa: E402

if numba.config.ENABLE_CUDASIM or not cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import weakref  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from execute_support import (QKV, STACK, assert_model, cast, cli_run, fail_read_at, fused, holds_open,  # noqa: E402
                             interrupt_at, one_line,
                             gone, live_room_by_call, load_checked, refuse_direct_open, spec_file, stacked, synth,
                             use_parts, watch_regions)

from planc.execute.pipeline.events import RunStarted  # noqa: E402
from planc.base import settings  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import AdmissionError, FingerprintError, Interrupted, ReadError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.device.seam import default_device, pinned_ring, release  # noqa: E402
from planc.execute.device.memory import rss_bytes  # noqa: E402
from planc.execute.device.seam import memory_info  # noqa: E402
from planc.plan.codec import save_plan  # noqa: E402
from planc.tools.synth import write_checkpoint  # noqa: E402

# Small tensors get small grids on purpose.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:.*GPU under-utilization")]

MIB = 2**20
# Device free memory after a fault may sit this much below the baseline (the arena is 16 MiB, so a
# leaked arena or landing region fails). Seen on the H200 with kernels launched from their cubins:
# 0 bytes after every fault. With every launch dispatched by numba (PLANC_RAW_LAUNCH=0, or the very
# first process, which compiles), failed loads held about 1.1 MiB each, in 2 MiB steps.
DEVICE_SLACK = 2 * MIB
ROOT = Path(__file__).resolve().parent.parent

# 16 MiB in two shards: 73 requests through an 8-slot ring, 45 kernels (fuse, BF16 -> F16 in place,
# BF16 -> F32 through a landing region), so a fault in the middle finds every kind of allocation live.
FAULT_IO = {"workers": 4, "slot": "256KiB", "slots": 8, "run": "4MiB", "merge_gap": "64KiB", "direct": "off"}
FAULT_RULES = [QKV, {"match": "*.mlp.*", "dtype": "float16"}, {"match": "*layernorm.weight", "dtype": "float32"},
               {"match": "*"}]


# ------------------------------------------------------------------------------------------
# measuring: pinned host memory, device memory, the process


class PinnedLedger:
    """Page-locked host memory as the CUDA driver handed it out and took it back: {address: bytes}."""

    ALLOC, FREE, REGISTER, UNREGISTER = "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostRegister_v2", "cuMemHostUnregister"

    def __init__(self):
        self.lock = threading.Lock()
        self.live: dict[int, tuple[int, bool]] = {}  # address -> (bytes, registered rather than allocated)
        self.freed: dict[int, bool] = {}  # addresses given back, not yet confirmed with the driver
        self.allocs = 0  # pinned allocations seen, ever
        self.unknown_frees = 0  # frees of memory pinned before the ledger was installed
        self.saved: dict = {}

    def install(self) -> None:
        from planc.execute.device import driver

        cu = driver.lib()
        self.driver = cu
        # The executor looks each function up on the bound library at every call (the finalizer of a
        # pinned buffer too), so replacing the attribute sees every call, from every thread.
        for name in (self.ALLOC, self.FREE, self.REGISTER, self.UNREGISTER):
            self.saved[name] = getattr(cu, name)
        real = self.saved

        def host_alloc(pp, size, *a):  # pp: byref(c_void_p) that receives the address
            rc = real[self.ALLOC](pp, size, *a)
            if rc == 0:
                self._add(pp._obj.value, size, False)
            return rc

        def free_host(p, *a):
            rc = real[self.FREE](p, *a)  # only what the driver took back leaves the ledger
            if rc == 0:
                self._drop(p)
            return rc

        def register(p, size, *a):
            rc = real[self.REGISTER](p, size, *a)
            if rc == 0:
                self._add(p, size, True)
            return rc

        def unregister(p, *a):
            rc = real[self.UNREGISTER](p, *a)
            if rc == 0:
                self._drop(p)
            return rc

        for name, fn in ((self.ALLOC, host_alloc), (self.FREE, free_host), (self.REGISTER, register),
                         (self.UNREGISTER, unregister)):
            setattr(cu, name, fn)

    def uninstall(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.driver, name, fn)

    def _add(self, p, size: int, registered: bool) -> None:
        with self.lock:
            a = _addr(p)
            self.live[a] = (int(size), registered)
            self.freed.pop(a, None)
            self.allocs += 1

    def _drop(self, p) -> None:
        with self.lock:
            a = _addr(p)
            entry = self.live.pop(a, None)
            if entry is None:
                self.unknown_frees += 1
            else:
                self.freed[a] = entry[1]

    def live_bytes(self) -> int:
        with self.lock:
            return sum(n for n, _ in self.live.values())

    def stale(self) -> list[str]:
        """Addresses the ledger saw given back that the driver still reports page-locked (none, or a leak
        the wrappers did not see). Confirmed addresses are forgotten."""
        with self.lock:
            freed, live = dict(self.freed), [(a, n) for a, (n, _) in self.live.items()]
        bad = []
        for a, registered in freed.items():
            if any(lo <= a < lo + n for lo, n in live):
                continue  # a later allocation covers it
            if _driver_pins(a, registered):
                bad.append(hex(a))
            else:
                with self.lock:
                    self.freed.pop(a, None)
        return bad


def _addr(p) -> int:
    """An address as an int (or a ctypes c_void_p)."""
    return int(getattr(p, "value", p) or 0)


_libcuda = None
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2


def _driver_pins(addr: int, registered: bool) -> bool:
    """Whether the driver still knows `addr` as page-locked host memory.

    cuMemHostGetFlags succeeds only inside an allocation of cuMemHostAlloc / cuMemAllocHost; for
    registered memory cuPointerGetAttribute(MEMORY_TYPE) succeeds only while it is registered."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
        lib.cuMemHostGetFlags.restype = ctypes.c_int
        lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        lib.cuPointerGetAttribute.restype = ctypes.c_int
        _libcuda = lib
    out = ctypes.c_uint(0)
    if registered:
        return _libcuda.cuPointerGetAttribute(ctypes.byref(out), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) == 0
    return _libcuda.cuMemHostGetFlags(ctypes.byref(out), ctypes.c_void_p(addr)) == 0


LEDGER = PinnedLedger()


@pytest.fixture(scope="module", autouse=True)
def _ledger():
    LEDGER.install()
    yield LEDGER
    LEDGER.uninstall()


def pinned_bytes() -> int:
    """Bytes of host memory page-locked by the CUDA driver now, as counted by the ledger."""
    return LEDGER.live_bytes()


def _status() -> dict:
    keys = {"RssShmem": "rss_shmem", "VmLck": "vm_lck", "VmPin": "vm_pin"}
    out = dict.fromkeys(keys.values(), 0)
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            out[keys[k]] = int(v.split()[0]) * 1024
    return out


def _nvidia_mapped_bytes() -> int:
    """Bytes of this process's address space mapped from /dev/nvidia* (pinned memory may be among them)."""
    total = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/dev/nvidia"):
            lo, hi = parts[0].split("-")
            total += int(hi, 16) - int(lo, 16)
    return total


def snapshot() -> dict:
    """Device free memory, pinned bytes and the process's memory, after a garbage collection
    (`release()`: what only a collection frees, such as cycles through a failure's frames)."""
    release()
    return {"device_free": memory_info()[0], "pinned": pinned_bytes(), "rss": rss_bytes(), **_status(),
            "nvidia_maps": _nvidia_mapped_bytes()}


def record(test: str, **figures) -> None:
    """Print one JSON line of figures, and append it to $PLANC_FAULTS_LOG when set."""
    line = json.dumps({"test": test, **figures}, sort_keys=True)
    print(line, file=sys.__stdout__, flush=True)  # past capsys, which the CLI checks read
    log = os.environ.get("PLANC_FAULTS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def _ref(obj):
    return weakref.ref(obj) if obj is not None else (lambda: None)


def _fds_under(folder: str) -> list[str]:
    """Targets of this process's open file descriptors inside `folder` (the checkpoint's)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder):
            out.append(target)
    return out


class Watch:
    """The loads of one test: `start(plan)` warms up and takes the baseline; `check()` asserts that
    everything a load allocated is back, while the caller may still hold the error."""

    def __init__(self, monkeypatch, test: str, folder: Path):
        self.test, self.folder = test, str(folder)
        # each load's regions: the ring and the arena, weakly (also when allocation fails part way)
        self.seen: list = watch_regions(monkeypatch)

    def start(self, plan) -> dict:
        # The first load creates the context and compiles and loads the kernels (their modules stay
        # in device memory): the baseline is taken after one good load of the same plan.
        execute(plan).free()
        self.seen.clear()
        self.threads = threading.active_count()
        self.allocs = LEDGER.allocs
        self.before = snapshot()
        assert self.before["pinned"] == 0, f"{self.before['pinned']:,} bytes pinned after a load was freed"
        return self.before

    def check(self, what: str, allocated: bool = True, pinned_used: bool = False) -> dict:
        after = snapshot()
        d = _delta(self.before, after)
        record(self.test, what=what, before=self.before, after=after, delta=d,
               pinned_allocs=LEDGER.allocs - self.allocs)
        assert bool(self.seen) == allocated, "a load allocated although it should have been refused first"
        for rec in self.seen:
            assert gone(rec, "ring"), "the pinned ring outlived the failed load"
            assert gone(rec, "arena"), "the device arena outlived the failed load"
        self.seen.clear()
        if pinned_used:  # the ledger saw the ring being pinned: what it says below is about real memory
            assert LEDGER.allocs > self.allocs, "the load pinned nothing the ledger saw"
        self.allocs = LEDGER.allocs
        assert after["device_free"] >= self.before["device_free"] - DEVICE_SLACK, \
            f"device memory held after the load: {-d['device_free']:,} bytes"
        assert after["pinned"] <= self.before["pinned"], f"pinned host memory held: {d['pinned']:,} bytes"
        assert LEDGER.stale() == [], "the driver still pins memory the ledger saw given back"
        assert _fds_under(self.folder) == [], "checkpoint files left open"
        assert not [t.name for t in threading.enumerate() if t.name.startswith("planc-")], \
            [t.name for t in threading.enumerate()]
        assert threading.active_count() <= self.threads, [t.name for t in threading.enumerate()]
        return after


@pytest.fixture
def watch(request, monkeypatch, tmp_path):
    return Watch(monkeypatch, request.node.name, tmp_path)


# ------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def dense16(tmp_path):
    """A ~16 MiB dense BF16 checkpoint in two shards, per test (some tests change its files)."""
    return synth(tmp_path, "dense", size_bytes=16 * MIB, shards=2)


def _plan_file(tmp_path, path, rules=None, io=None) -> tuple[Path, object]:
    plan = compile_spec(spec_file(tmp_path, path, rules or FAULT_RULES, io=io or FAULT_IO, host="1GiB"))
    assert plan.fits, plan.refusal
    save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json", plan


def _last_shard(plan) -> str:
    return os.path.join(plan.to_dict()["checkpoint"]["root"], plan.to_dict()["checkpoint"]["files"][-1]["path"])


# ------------------------------------------------------------------------------------------
# the instrument


def test_the_ledger_sees_pinned_memory(request):
    """What the fault tests rely on: a ring slot pinned the loader's way (on a thread of its own, as
    the loader's pinner does) is counted, known to the driver while held, and gone from both after."""
    release()
    before = snapshot()
    held = []
    t = threading.Thread(target=lambda: held.append(pinned_ring(default_device(), 8 * MIB)), name="pin-probe")
    t.start()
    t.join()
    owner, view = held.pop()
    during = snapshot()
    addr = owner.ctypes.data
    record(request.node.name, what="holding 8 MiB pinned", before=before, during=during, delta=_delta(before, during))
    assert during["pinned"] - before["pinned"] == owner.nbytes >= 8 * MIB
    registered = LEDGER.live[addr][1]
    assert registered == (settings.pin() == "register")  # the default: huge pages registered
    assert _driver_pins(addr, registered)
    del owner, view
    after = snapshot()
    record(request.node.name, what="given back", after=after, delta=_delta(before, after))
    assert after["pinned"] == before["pinned"]
    assert not _driver_pins(addr, registered), "the driver still pins the buffer after release()"
    assert LEDGER.stale() == []


# ------------------------------------------------------------------------------------------
# 1. faults during run


@pytest.mark.parametrize("change", ["truncate", "replace", "remove", "truncate-during-load"])
def test_shard_changed_after_compile(tmp_path, capsys, dense16, watch, monkeypatch, change):
    path, _ = dense16
    plan_path, plan = _plan_file(tmp_path, path)
    watch.start(plan)
    shard = _last_shard(plan)
    size = os.path.getsize(shard)
    if change == "truncate":
        with open(shard, "r+b") as f:
            f.truncate(size - 4096)
    elif change == "replace":  # another file of the same size moved into place, as a re-download does
        other = Path(shard).with_suffix(".new")
        other.write_bytes(Path(shard).read_bytes()[::-1])
        st_ = os.stat(shard)
        os.utime(other, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
        os.replace(other, shard)
    elif change == "remove":
        os.remove(shard)
    else:  # the fingerprints pass, then the shard loses its second half while the load runs
        def truncate_once_started(event):  # after the fingerprints and admission, before the first read
            if isinstance(event, RunStarted) and os.path.getsize(shard) == size:
                with open(shard, "r+b") as f:
                    f.truncate(size // 2)

        use_parts(monkeypatch, observer=truncate_once_started)
    during = change == "truncate-during-load"
    error, code = (ReadError, "read-short") if during else \
        (FingerprintError, "file-removed" if change == "remove" else "file-changed")
    with pytest.raises(error) as ei:
        execute(plan)
    assert ei.value.code == code and ei.value.exit_code == 2 and shard in ei.value.message
    watch.check("api", allocated=during, pinned_used=during)
    del ei
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    code = "file-changed" if during else code  # the shard is short now: the fingerprint check sees it first
    assert rc == 2 and out == "" and shard in one_line(err) and err.strip().endswith(f"[{code}]")
    watch.check("cli", allocated=False)


def test_read_failing_mid_load(tmp_path, capsys, dense16, watch, monkeypatch):
    """The disk fails (EIO) half way through the reads: ReadError, exit 2, everything back."""
    path, _ = dense16
    plan_path, plan = _plan_file(tmp_path, path)
    fail_at = plan.totals.requests // 2
    assert fail_at > 8  # past the ring's first round: slots pinned, copies and kernels in flight
    watch.start(plan)
    calls = fail_read_at(monkeypatch, fail_at)
    with pytest.raises(ReadError) as ei:
        execute(plan)
    assert ei.value.code == "read-failed" and ei.value.exit_code == 2 and "Input/output error" in ei.value.message
    watch.check("api", pinned_used=True)
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 2 and out == "" and one_line(err).endswith("[read-failed]")
    watch.check("cli", pinned_used=True)


def test_repeated_faults_hold_no_device_memory(tmp_path, dense16, monkeypatch):
    """Twenty failed loads in a row (EIO half way): from the 2nd to the 20th, device free memory,
    pinned bytes and RSS stay where they were."""
    path, _ = dense16
    _, plan = _plan_file(tmp_path, path)
    fail_at = plan.totals.requests // 2
    execute(plan).free()
    calls = fail_read_at(monkeypatch, fail_at)
    marks = {}
    for i in range(1, 21):
        calls.clear()
        with pytest.raises(ReadError):
            execute(plan)
        if i in (2, 20):
            marks[i] = snapshot()
    growth = _delta(marks[2], marks[20])
    record("test_repeated_faults_hold_no_device_memory", fault2=marks[2], fault20=marks[20], growth=growth)
    assert -growth["device_free"] <= 0, f"device free memory fell {-growth['device_free']:,} bytes over 18 faults"
    assert growth["pinned"] <= 0 and marks[20]["pinned"] == 0
    assert growth["rss"] <= 8 * MIB


def test_interrupt_during_the_load_in_process(tmp_path, capsys, dense16, watch, monkeypatch):
    """KeyboardInterrupt in the middle of the pipeline: Interrupted (exit 130), everything back."""
    path, _ = dense16
    plan_path, plan = _plan_file(tmp_path, path)
    at = plan.totals.requests // 2
    watch.start(plan)
    calls = interrupt_at(monkeypatch, at)
    with pytest.raises(Interrupted) as ei:
        execute(plan)
    assert ei.value.code == "interrupted" and ei.value.exit_code == 130
    watch.check("api", pinned_used=True)
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 130 and out == "" and "interrupted during the load" in one_line(err)
    watch.check("cli", pinned_used=True)


def test_live_room_shrinks_below_a_run(tmp_path, capsys, dense16, watch, monkeypatch):
    """Room for the first host-path run, none after: the second is refused once the runs in flight are done."""
    path, _ = dense16
    rules = [{"match": "*.mlp.*", "dtype": "float32", "on": "host"}, {"match": "*"}]
    plan_path, plan = _plan_file(tmp_path, path, rules=rules, io=dict(FAULT_IO, run="1MiB"))
    host_runs = [r for r in plan.to_dict()["runs"] if r["host_bytes"]]
    assert len(host_runs) >= 2
    watch.start(plan)
    calls = live_room_by_call(monkeypatch, lambda k: 2**40 if k == 1 else 0)
    with pytest.raises(AdmissionError) as ei:
        execute(plan)
    second = host_runs[1]
    assert ei.value.code == "live-room" and ei.value.exit_code == 3
    r = ei.value.refusal
    assert (r.run, r.needed_bytes, r.allowed_bytes) == (second["index"], second["host_bytes"], 0)
    watch.check("api", pinned_used=True)
    del ei
    calls.clear()
    rc, out, err = cli_run(capsys, "run", plan_path, "--json")
    assert rc == 3 and out == "" and one_line(err).endswith("[live-room]")
    assert f"refused at run {second['index']}" in err
    watch.check("cli", pinned_used=True)


def test_file_system_refusing_o_direct(tmp_path, capsys, dense16, watch, monkeypatch):
    """A file system that refuses O_DIRECT (EINVAL at open): under `auto` the load succeeds with buffered
    reads and the report says so; under `on` it is a named refusal, raised after the arena and the ring
    were allocated, and they are given back."""
    path, want = dense16
    auto_path, auto = _plan_file(tmp_path, path, io=dict(FAULT_IO, direct="auto"))
    on = compile_spec(spec_file(tmp_path, path, FAULT_RULES, io=dict(FAULT_IO, direct="on"), host="1GiB",
                                name="on.yaml"))
    watch.start(auto)
    refuse_direct_open(monkeypatch)  # and a cold page cache, so that `auto` asks for O_DIRECT
    model = execute(auto)
    files = model.report["files"]
    assert len(files) == 2 and all(m == {"direct": False, "why": "file system refuses O_DIRECT"}
                                   for m in files.values()), files
    layers = sum(1 for k in want if k.endswith(".self_attn.q_proj.weight"))
    out = fused(want, layers)
    assert_model(model, {k: cast(v, "F16") if ".mlp." in k else cast(v, "F32") if k.endswith("layernorm.weight")
                         else v for k, v in out.items()})
    model.free()
    del model
    watch.check("auto: buffered", pinned_used=True)
    rc, out_, err = cli_run(capsys, "run", auto_path, "--json")
    assert rc == 0 and all(m["why"] == "file system refuses O_DIRECT" for m in json.loads(out_)["files"].values())
    watch.check("auto: buffered, cli")
    with pytest.raises(ReadError) as ei:
        execute(on)
    assert ei.value.code == "direct-refused" and ei.value.exit_code == 2
    watch.check("on: refused")
    del ei
    save_plan(on, tmp_path / "on.json")
    rc, out_, err = cli_run(capsys, "run", tmp_path / "on.json", "--json")
    assert rc == 2 and out_ == "" and one_line(err).endswith("[direct-refused]")
    watch.check("on: refused, cli")


# ------------------------------------------------------------------------------------------
# 2. SIGINT to `planc run`


def test_sigint_during_the_load(tmp_path, request):
    """`planc run --json` gets SIGINT while it loads 1.5 GiB: exit 130, one line on stderr.

    Every tensor is converted BF16 -> F32 on the host and staged through a two-slot ring of 512 KiB
    (6,000 copies), so the load lasts seconds; the reader opening the shards (after admission and
    allocation) says the load has started."""
    res = write_checkpoint(tmp_path / "big", "dense", size_bytes=1536 * MIB, shards=2)
    _, plan = _plan_file(tmp_path, res.path, rules=[{"match": "*", "dtype": "float32", "on": "host"}],
                         io={"workers": 1, "slot": "512KiB", "slots": 2, "run": "64MiB", "direct": "off"})
    env = dict(os.environ)
    for k in ("NUMBA_ENABLE_CUDASIM", "PLANC_DEBUG"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "planc", "run", str(tmp_path / "plan.json"), "--json"], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shards = {os.path.realpath(f) for f in res.files}
    t0 = time.monotonic()
    try:
        while not holds_open(proc.pid, shards):
            assert proc.poll() is None, f"planc run ended before it was interrupted: {proc.communicate()}"
            assert time.monotonic() - t0 < 180, "the load never started"
            time.sleep(0.01)
        opened = time.monotonic()
        time.sleep(0.2)  # past the ring's first slots: reads, conversions and copies running
        assert proc.poll() is None, "the load finished before it could be interrupted: make it slower"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    record(request.node.name, payload_bytes=plan.totals.payload_bytes, start_to_open_s=round(opened - t0, 3),
           open_to_exit_s=round(time.monotonic() - opened, 3), rc=proc.returncode, stderr=err)
    # 130, or the signal itself should it land where Python ends by SIGINT after planc's own exit
    # (shells report both as 130); never 0, which would mean the load finished first.
    assert proc.returncode in (130, -signal.SIGINT) and out == "", (proc.returncode, out[-2000:], err)
    line = one_line(err)
    assert "interrupted during the load" in line and line.endswith("[interrupted]")


# ------------------------------------------------------------------------------------------
# 3. repeated loads


# Two layers of 32 experts, 32 MiB: 34 requests, 69 copies, 224 kernels (192 stacked expert weights
# converted BF16 -> F16 in place, 24 requests scattered into the stacks by the scatter kernel, router
# weights BF16 -> F16, norms BF16 -> F32 through a landing region, two transposes), plain copies for
# the rest (embeddings, lm_head, fused q/k/v).
CYCLE_RULES = [QKV, dict(STACK, dtype="float16"), {"match": "*layernorm.weight", "dtype": "float32"},
               {"match": "*.self_attn.o_proj.weight", "transpose": True},
               {"match": "*.mlp.gate.weight", "dtype": "float16"}, {"match": "*"}]


def _cycle_expected(want: dict, layers: int, experts: int) -> dict:
    out = stacked(fused(want, layers), layers, experts, "F16")
    for k, v in out.items():
        if k.endswith("layernorm.weight"):
            out[k] = cast(v, "F32")
        elif k.endswith(".mlp.gate.weight"):
            out[k] = cast(v, "F16")
        elif k.endswith(".self_attn.o_proj.weight"):
            out[k] = np.ascontiguousarray(v.T)
    return out


def test_hundred_load_free_cycles(tmp_path, request):
    """100 loads and frees of a 32 MiB MoE plan with every kind of device work: neither host memory,
    pinned memory nor device memory grows from cycle 10 to cycle 100."""
    layers, experts = 2, 32
    path, want = synth(tmp_path, "moe", size_bytes=32 * MIB, layers=layers, experts=experts)
    spec = spec_file(tmp_path, path, CYCLE_RULES, io={"workers": 8, "slot": "1MiB", "slots": 8, "run": "8MiB",
                                                       "merge_gap": "1MiB"}, host="1GiB")
    plan = compile_spec(spec)
    tot = plan.to_dict()["totals"]
    # over 200 parts converted, dequantized or transposed on the device (neighbours share a launch)
    assert sum(len(k.parts) for r in plan.runs for k in r.kernels) >= 200 and tot["scatters"] > 0
    expected = _cycle_expected(want, layers, experts)
    models: list = []
    load_checked(spec, models)  # cycle 1: verified by the executor, and against numpy here
    assert_model(models[0], expected)
    models.pop().free()
    figures, times = {}, []
    # Every load ends with full garbage collections (planc.execute.device.seam.release); frozen, the objects
    # of the test session are not walked again each time. What is measured does not change.
    gc.collect()
    gc.freeze()
    try:
        for cycle in range(2, 101):
            t0 = time.perf_counter()
            model = execute(plan)
            assert len(model) == len(plan.to_dict()["tensors"])
            model.free()
            del model
            times.append(time.perf_counter() - t0)
            if cycle in (10, 100):
                figures[cycle] = snapshot()
    finally:
        gc.unfreeze()
    growth = _delta(figures[10], figures[100])
    record(request.node.name, kernels=tot["kernels"], copies=tot["copies"], scatters=tot["scatters"],
           cycle10=figures[10], cycle100=figures[100], growth=growth,
           seconds_per_cycle={"median": round(sorted(times)[len(times) // 2], 4), "max": round(max(times), 4)})
    assert growth["rss"] <= 8 * MIB, f"RSS grew {growth['rss']:,} bytes from cycle 10 to cycle 100"
    assert growth["pinned"] <= 0 and figures[100]["pinned"] == 0, figures[100]
    assert -growth["device_free"] <= DEVICE_SLACK, f"device free memory fell {-growth['device_free']:,} bytes"
    assert LEDGER.stale() == []
    load_checked(spec, models)  # and the load after them is still right
    assert_model(models[0], expected)
    models.pop().free()
