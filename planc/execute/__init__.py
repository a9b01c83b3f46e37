"""execute: Plan -> `LoadedModel` on the GPU (Numba CUDA), with the measured report.

Order of events: fingerprints checked; the whole plan re-admitted against live host memory and free
device memory; only then the arena, landing regions and pinned ring are allocated; runs go in plan
order, each checked against the live room before it starts; every host buffer is released when
its bytes are on the device; on any error everything allocated is freed and a typed error raised.

On a GPU the executor talks to the CUDA driver through `seam` (ctypes) and launches the kernels from
the machine code shipped with the package; numba is imported only under the simulator, or for a
launch that no shipped code serves. This package is the only one that imports numba.
"""

from __future__ import annotations

import os
import time

from ..errors import AdmissionError, ExecuteError, FingerprintError, Interrupted, PlancError
from ..ir import Plan
from ..units import gib

__all__ = ["execute"]


def check_fingerprints(plan) -> None:
    root = plan.checkpoint.root
    for f in plan.checkpoint.files:
        path = os.path.join(root, f.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FingerprintError(f"{path}: checkpoint file removed since the plan was compiled; compile again",
                                   code="file-removed") from None
        if st.st_size != f.size_bytes or st.st_mtime_ns != f.mtime_ns:
            raise FingerprintError(
                f"{path}: changed since the plan was compiled (size {f.size_bytes:,} -> {st.st_size:,} bytes, "
                f"mtime_ns {f.mtime_ns} -> {st.st_mtime_ns}); compile again", code="file-changed")


def admit_live(plan) -> dict:
    from .memory import live_room
    from .seam import memory_info, simulated

    room = live_room()
    need = plan.peak.host_bytes
    what = "the plan's host peak"
    if simulated():  # the simulator's device memory is host memory: the regions count against the room
        need += plan.layout.device_bytes
        what = "the plan's host peak plus its simulated device regions"
    if need > room["room_bytes"]:
        raise AdmissionError(
            f"refused before allocating: {what} is {need:,} bytes ({gib(need)}), the live room is "
            f"{room['room_bytes']:,} bytes ({gib(room['room_bytes'])}) (available {room['available_bytes']}, cgroup "
            f"room {room['cgroup_room_bytes']}, reserve {room['reserve_bytes']}); lower io.slots/io.slot or io.run",
            code="live-room", refusal={"run": 0, "needed_bytes": need, "allowed_bytes": room["room_bytes"]})
    info = memory_info()
    dev_need = plan.peak.device_bytes
    if info is not None and dev_need > info[0]:
        raise AdmissionError(
            f"refused before allocating: the plan needs {dev_need:,} bytes ({gib(dev_need)}) of device memory, "
            f"{plan.device} has {info[0]:,} bytes ({gib(info[0])}) free; skip tensors or load a smaller dtype",
            code="device-room", refusal={"run": 0, "needed_bytes": dev_need, "allowed_bytes": info[0]})
    return {"host": room, "device_free_bytes": None if info is None else info[0],
            "device_total_bytes": None if info is None else info[1]}


def execute(plan: "Plan", *, progress: bool = False, verify: bool = False, device: str | None = None,
            settings: dict | None = None):
    """Load `plan` onto the device. Returns a LoadedModel; raises a PlancError subclass on failure.

    `settings` (name -> value, `planc.settings.NAMES`) are in force over the environment for this
    call: `{"host_reserve": "1GiB", "raw_launch": False, "kernel_dir": "/tmp/k"}`."""
    from .. import settings as _settings

    with _settings.overridden(settings):
        return _execute(plan, progress=progress, verify=verify, device=device)


def _execute(plan: "Plan", *, progress: bool, verify: bool, device: str | None):
    from . import launch
    from .loader import Loader
    from .memory import hwm_bytes, pin_method, reset_hwm, rss_bytes
    from .model import DeviceTensor, LoadedModel
    from .seam import memory_info, release, select, settle_released, simulated

    if not plan.fits:
        r = plan.refusal
        raise AdmissionError(r.message, code=r.code, refusal=r._asdict())
    t_prep = time.perf_counter()
    settle_released()  # an earlier load's ring is unpinned before this one measures and admits
    pin_method()  # a bad PLANC_PIN is refused before anything is allocated
    check_fingerprints(plan)
    dev = plan.device if device is None else _device_arg(device)
    idx = select(dev)  # attaches to the device's primary context (made here if no one made it yet)
    live = admit_live(plan)
    base_rss = rss_bytes()
    hwm_reset = reset_hwm()
    free_before = memory_info()
    kernel_code = launch.stats()
    loader = Loader(plan)
    loader.device = dev
    loader.timings["prepare"] = time.perf_counter() - t_prep
    bar = _progress(plan) if progress else None
    t0 = time.perf_counter()
    try:
        try:
            loader.allocate()
            if bar:
                bar[0].start()
                loader.progress = bar[2]
            loader.run()
            free_alloc = memory_info()  # arena, landing and staging all still held
        finally:
            if bar:
                bar[0].stop()
        wall = time.perf_counter() - t0
        arena = loader.arena
        loader.arena = None
        t_free = time.perf_counter()
        loader.free(full=False)
        loader.timings["free"] = time.perf_counter() - t_free
    except PlancError as e:
        _drop_frames(e)
        loader.free()
        loader.drop_arena()
        raise
    except KeyboardInterrupt as e:
        _drop_frames(e)
        loader.free()
        loader.drop_arena()
        raise Interrupted("interrupted during the load; everything allocated was released") from None
    except Exception as e:  # noqa: BLE001 - any device or runtime failure: release, then a typed error
        _drop_frames(e)
        loader.free()
        loader.drop_arena()
        raise ExecuteError(f"load failed: {type(e).__name__}: {e}; everything allocated was released",
                           code="load-failed") from e
    hwm = hwm_bytes()
    tensors = {t.name: DeviceTensor(t.name, t.dtype, t.shape, t.offset_bytes, t.nbytes, arena, idx)
               for t in plan.tensors}
    report = _report(plan, loader, wall, base_rss, hwm, hwm_reset, free_before, free_alloc, live, simulated())
    report["kernel_code"] = launch.since(kernel_code)  # where this load's kernels came from (launch.stats)
    model = LoadedModel(tensors, report, arena)
    t_rel = time.perf_counter()
    release(full=False, settle=False)
    report["timings"]["release"] = round(time.perf_counter() - t_rel, 6)
    report["host"]["rss_after_bytes"] = rss_bytes()
    if verify:
        from .verify import verify_model

        try:
            report["verify"] = verify_model(plan, model)
        except BaseException:
            model.free()
            raise
    return model


def _drop_frames(e: BaseException) -> None:
    """Clear the locals of the finished frames in `e`'s tracebacks (reader threads included).

    Those frames hold views of the pinned ring and the arena; the error outlives the load (a caller
    keeps it, logs it, retries), and the memory must not live as long as it does.
    """
    import traceback

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def _progress(plan):
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    total_parts = len(plan.parts)
    p = Progress(TextColumn("loading"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                 TextColumn("{task.fields[parts]}/" + str(total_parts) + " tensor parts"), TimeRemainingColumn(),
                 console=Console(file=sys.stderr, emoji=False), transient=True)
    task = p.add_task("load", total=plan.totals.payload_bytes, parts=0)
    done = [0]

    def advance(nbytes: int, parts: int = 0) -> None:
        done[0] += parts
        p.update(task, advance=nbytes, parts=done[0])

    return p, task, advance


def _report(plan, loader, wall, base_rss, hwm, hwm_reset, free_before, free_alloc, live, sim) -> dict:
    t = plan.totals
    c = loader.counters
    lay = plan.layout
    payload = t.payload_bytes
    dev_used = None
    if free_before is not None and free_alloc is not None:
        dev_used = free_before[0] - free_alloc[0]
    return {
        "simulator": sim,
        "device": loader.device,
        "tensor_parallel": plan.tensor_parallel._asdict(),
        "wall_seconds": wall,
        "gb_per_s": payload / wall / 1e9 if wall > 0 else None,
        "payload_bytes": payload,
        "bytes_read": {"predicted": t.read_bytes, "measured": loader.reader.bytes_read if loader.reader else None},
        "requests": {"predicted": t.requests, "issued": c["requests"]},
        "copies": {"predicted": t.copies, "issued": c["copies"]},
        "kernels": {"predicted": t.kernels, "issued": c["kernels"]},
        "run_waits": c["run_waits"],
        "timings": {k: round(v, 6) for k, v in loader.timings.items()},
        "host": {
            "predicted_peak_bytes": plan.peak.host_bytes,
            "pinned_bytes": lay.ring_bytes,
            "pinned_by": loader.dev.pin_method(),
            "baseline_rss_bytes": base_rss,
            "hwm_bytes": hwm,
            "hwm_reset": hwm_reset,
            "growth_bytes": hwm - base_rss,
            "live_room_bytes": live["host"]["room_bytes"],
        },
        "device_memory": {
            "predicted_peak_bytes": plan.peak.device_bytes,
            "arena_bytes": lay.arena_bytes,
            "landing_bytes": lay.landing_bytes,
            "measured_allocated_bytes": dev_used,
            "free_before_bytes": None if free_before is None else free_before[0],
        },
        "files": loader.reader.modes() if loader.reader else {},
        "retries": loader.reader.retries if loader.reader else 0,
    }


def _device_arg(device) -> str:
    """`device=` of a load: `cuda` or `cuda:N`, else a typed error before anything is allocated."""
    from ..device import check_device
    from ..errors import SpecError

    try:
        return check_device(device)
    except ValueError as e:
        raise SpecError(f"device {e}", code="bad-device") from None
