"""The pinned ring's lanes, the off-path release of a finished load's ring, and `planc run`'s head
start (under the simulator: its pinned memory is numba's, the threads and their order are real)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import weakref

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from planc.face import prestart  # noqa: E402
from planc.execute.device import seam  # noqa: E402
from planc.execute.io.ring import Pinner, Slots  # noqa: E402

MIB = 1 << 20


def _pin_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("planc-pin")]


class Pinning:
    """The simulator's device, with each ring slot's pinning handed to `pin(nbytes)` first."""

    def __init__(self, pin):
        self.inner, self.pin = seam.default_device(), pin

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def pinned_bytes(self, nbytes):
        self.pin(nbytes)
        return self.inner.pinned_bytes(nbytes)


def test_lanes_pin_every_slot_once_and_in_order():
    n = 12
    slots, owners = Slots([None] * n), Slots([None] * n)
    taken = []
    dev = Pinning(lambda nbytes: taken.append(threading.current_thread().name))
    p = Pinner(slots, owners, 64 * 1024, dev, lanes=4)
    for k in range(n):
        p.wait(k)
        assert slots[k] is not None and slots[k].nbytes == 64 * 1024
        assert slots[k].ctypes.data % seam.ALIGN == 0
    p.stop()
    assert len(taken) == n and len(set(taken)) <= 4 and len(p.jobs) == 4
    assert len({s.ctypes.data for s in slots}) == n  # twelve buffers, none shared
    assert _pin_threads() == []


def test_a_lane_that_fails_raises_at_the_wait_and_the_others_stop():
    slots, owners = Slots([None] * 8), Slots([None] * 8)
    calls = []
    lock = threading.Lock()

    def pin(nbytes):
        with lock:
            calls.append(1)
            if len(calls) == 3:
                raise MemoryError("injected: no pinned memory")

    p = Pinner(slots, owners, 4096, Pinning(pin), lanes=2)
    with pytest.raises(MemoryError, match="injected"):
        for k in range(8):
            p.wait(k)
    p.stop()
    assert any(s is None for s in slots) and len(calls) < 8 + 2
    assert _pin_threads() == []


def test_stop_while_pinning_leaves_no_thread_and_no_slot_taken_after_it():
    slots, owners = Slots([None] * 64), Slots([None] * 64)
    p = Pinner(slots, owners, MIB, seam.default_device(), lanes=3)
    p.wait(0)
    p.stop()
    pinned = sum(s is not None for s in slots)
    assert _pin_threads() == [] and pinned >= 1
    assert sum(s is not None for s in slots) == pinned  # nothing lands after stop() returned


def test_release_later_gives_the_ring_back_off_the_callers_thread():
    slots = Slots([seam.pinned_ring(seam.default_device(), MIB)[1] for _ in range(3)])
    gone = weakref.ref(slots)
    freed_on = []
    weakref.finalize(slots, lambda: freed_on.append(threading.current_thread().name))
    held = [slots]
    del slots
    seam.release_later(held)
    seam.settle_released()
    gc.collect()
    assert gone() is None and held == []
    assert freed_on == ["planc-unpin"]
    assert seam._unpinning == []


def test_a_finished_loads_ring_is_unpinned_before_the_next_load_measures(tmp_path):
    """The ring of a load that returned is given back by the unpinning thread; the next load waits for
    it first thing, so its baseline and admission see the memory free."""
    from planc.compiler.compile import compile_spec
    from planc.execute import execute
    from planc.execute.pipeline.allocation import Regions
    from planc.execute.pipeline.parts import Parts
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 3, workers: 2}\nrules:\n"
                    "  - match: '*'\n")
    plan = compile_spec(spec)
    rings, freed_on = [], []

    class Watched(Regions):
        def __init__(self, *a, **k):
            assert seam._unpinning == [] or all(not t.is_alive() for t in seam._unpinning), \
                "a load allocated while an earlier ring was still being unpinned"
            super().__init__(*a, **k)

        def pin_ring(self):
            super().pin_ring()
            rings.append(weakref.ref(self.ring_owner))
            weakref.finalize(self.ring_owner, lambda: freed_on.append(threading.current_thread().name))
            gc.collect()  # what a long load's own collections do: the regions and their ring reach the old generation

    gc.disable()  # nothing but reference counts may free the ring: no cycle may hold it
    try:  # the models are kept: the rings must go all the same
        models = [execute(plan, parts=Parts(regions=Watched.start)) for _ in range(2)]
    finally:
        gc.enable()
    seam.settle_released()
    assert len(rings) == 2 and all(r() is None for r in rings), "a finished load's ring outlived it"
    assert freed_on == ["planc-unpin", "planc-unpin"], freed_on
    for m in models:
        m.free()


def test_the_lanes_start_after_the_files_are_open_and_the_readers_threads_exist(tmp_path, monkeypatch):
    """Populating a slot holds the memory-map lock that mapping a file and starting a thread wait for:
    the caller's steps come first, and the lanes start last."""
    from planc.compiler.compile import compile_spec
    from planc.execute.pipeline import allocation
    from planc.execute import execute
    from planc.execute.pipeline.parts import Parts
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "ck", "dense", seed=0, shards=2)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 3, workers: 3}\nrules:\n"
                    "  - match: '*'\n")
    plan = compile_spec(spec)
    assert len(plan.checkpoint.files) == 2 and sum(len(r.requests) for r in plan.runs) >= 3
    seen, built = [], {}

    def reader(plan):
        built["reader"] = allocation.open_reader(plan)
        return built["reader"]

    def pool(plan):
        built["pool"] = allocation.open_pool(plan)
        return built["pool"]

    class Watched(allocation.Regions):
        def pin_ring(self):  # the lanes start here: what is open and started by then
            seen.append((sorted(getattr(built.get("reader"), "files", {})),
                         len(getattr(built.get("pool"), "_threads", ())), threading.current_thread().name))
            super().pin_ring()

    execute(plan, parts=Parts(regions=Watched.start, reader=reader, pool=pool)).free()
    assert seen == [(sorted(f.path for f in plan.checkpoint.files), 3, threading.current_thread().name)], seen


def test_a_thread_that_cannot_start_leaves_no_thread_waiting():
    """Starting the readers' threads, or the ring's lanes, can fail (no thread to be had, Ctrl-C):
    the error leaves at once, and no thread already started is left waiting or pinning."""
    from concurrent.futures import ThreadPoolExecutor

    from planc.execute.io import readers

    real_start = threading.Thread.start
    started = []

    def start(self):
        if self.name.startswith(("planc-read", "planc-pin")) and len(started) == 2:
            raise RuntimeError("can't start new thread")
        started.append(self)
        real_start(self)

    threading.Thread.start = start
    try:
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="planc-read")
        with pytest.raises(RuntimeError):
            readers.start_threads(pool, 4)
        done = threading.Event()
        threading.Thread(target=lambda: (pool.shutdown(wait=True), done.set()), daemon=True).start()
        assert done.wait(5), "a reader thread was left waiting at the gate"
        started.clear()
        ring = Slots([None] * 8)
        with pytest.raises(RuntimeError):
            Pinner(ring, Slots([None] * 8), MIB, seam.default_device(), lanes=4)
    finally:
        threading.Thread.start = real_start
    assert all(not t.is_alive() for t in started)  # the lanes that started were stopped


# -- planc run's head start -------------------------------------------------------------------

def test_run_device_from_the_raw_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    plan = tmp_path / "p.json"
    plan.write_text('{"kind":"planc-plan","format":3,"checkpoint":{},"device":"cuda:3"}')
    rd = prestart.run_device
    assert rd([str(plan)]) == "cuda:3"
    assert rd([str(plan), "--device", "cuda:1"]) == "cuda:1"
    assert rd(["--device=cuda:2", str(plan)]) == "cuda:2"
    assert rd(["--rank", "1", str(plan), "--json"]) == "cuda:3"  # the rank's value is no target
    assert rd(["--report", "r.json", str(plan)]) == "cuda:3"
    assert rd([str(plan), "--device", "cpu"]) is None  # not a device name: the command refuses it
    assert rd([str(plan), "--device"]) == "cuda:3"  # no value: the command refuses it; a head start is harmless
    assert rd([]) is None and rd([str(tmp_path / "missing.json")]) is None
    assert rd(["--", str(plan)]) == "cuda:3"
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert rd([str(plan)]) == "cuda:5"
    for bad in ("five", "\u00b2", "9" * 5000, "-1"):  # left to the command, which names it
        monkeypatch.setenv("LOCAL_RANK", bad)
        assert rd([str(plan)]) == "cuda:3"


@pytest.mark.parametrize("local_rank", ["\u00b2", "9" * 5000, "x"])
def test_a_bad_launcher_variable_is_the_commands_usage_error_not_a_crash(local_rank):
    """The head start reads LOCAL_RANK before the command does: whatever it holds, the command still
    reports it, one line and exit 2, as without the head start."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["LOCAL_RANK"] = local_rank
    out = subprocess.run([sys.executable, "-m", "planc", "run", "missing.json"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2, out.stderr
    assert "LOCAL_RANK" in out.stderr and "Traceback" not in out.stderr


PRESTART = """
import json, os, sys
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
os.environ.pop("OPENBLAS_NUM_THREADS", None)
import planc.face.prestart
mods = sorted(m for m in ("numpy", "typer", "rich", "pydantic", "numba", "planc.face.cli") if m in sys.modules)
print(json.dumps([mods, sorted(m for m in sys.modules if m.startswith("planc"))]))
"""


def test_the_head_start_imports_nothing_heavy():
    out = subprocess.run([sys.executable, "-c", PRESTART], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    heavy, _ = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == []


def test_planc_run_through_the_entry_point_under_the_simulator(tmp_path):
    """`python -m planc run` goes through the head start (which under the simulator starts nothing)
    and loads as before."""
    from planc.tools.synth import write_checkpoint

    write_checkpoint(tmp_path / "ck", "dense", seed=0)
    spec = tmp_path / "s.yaml"
    spec.write_text("checkpoint: ck\nbudget: {host: 64MiB}\nio: {slot: 64KiB, slots: 2}\nrules:\n  - match: '*'\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-m", "planc", "run", str(spec), "--json"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["simulator"] and rep["requests"]["issued"] == rep["requests"]["predicted"]


def test_every_caller_of_settle_waits_for_the_unpinning():
    import time

    class Slow:
        def __del__(self):
            time.sleep(0.3)

    seam.release_later([Slow()])
    t = seam._unpinning[0]
    returned_early = []

    def settle():
        seam.settle_released()
        returned_early.append(t.is_alive())

    callers = [threading.Thread(target=settle) for _ in range(3)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert returned_early == [False, False, False]
