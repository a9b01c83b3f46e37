"""execute: Plan -> `LoadedModel` on the device, with the measured report; the one place that
builds the load's parts.

Order of events: fingerprints checked; the whole plan re-admitted against live host memory and free
device memory; only then the arena, landing regions and pinned ring are allocated; runs go in plan
order, each checked against the live room before it starts; every host buffer is released when
its bytes are on the device; on any error everything allocated is freed and a typed error raised.

The device is chosen here (a name, or a `device.seam.Device` passed in) and handed to every part;
what runs below this module takes it as an argument and asks for no device of its own.
"""

from __future__ import annotations

import os
import time
import weakref

from ...base.errors import AdmissionError, ExecuteError, FingerprintError, Interrupted, PlancError, printable
from ...plan.records import ALLOC_DEVICE, ALLOC_RING, Plan, Refusal
from ...base.units import gib
from ...base.codes import Code

def check_fingerprints(plan) -> tuple:
    """Every checkpoint file is as the plan recorded it (size, mtime); returns what identifies the
    files as they are now (device, inode, size, mtime and ctime of each: `check_against_headers`)."""
    root = plan.checkpoint.root
    seen = []
    for f in plan.checkpoint.files:
        path = os.path.join(root, f.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FingerprintError(f"{path}: checkpoint file removed since the plan was compiled; compile again",
                                   code=Code.FILE_REMOVED) from None
        except (OSError, ValueError) as e:  # a symlink loop, a folder now a file, a name too long, a NUL
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise FingerprintError(f"{printable(path)}: checkpoint file cannot be read since the plan was compiled "
                                   f"({why}); compile again", code=Code.FILE_UNREADABLE) from None
        if st.st_size != f.size_bytes or st.st_mtime_ns != f.mtime_ns:
            raise FingerprintError(
                f"{path}: changed since the plan was compiled (size {f.size_bytes:,} -> {st.st_size:,} bytes, "
                f"mtime_ns {f.mtime_ns} -> {st.st_mtime_ns}); compile again", code=Code.FILE_CHANGED)
        seen.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(seen)


# plan -> the files' identities (`check_fingerprints`) when its reads were last found where the
# headers put them: the same Plan (a frozen value) over the same files is not checked again. Only
# files whose mtime and ctime are RACY_NS older than the check are taken so: a file system stamps
# times at its own grain (a clock tick, a second, two), and a write in the same grain as the stamp
# recorded would leave it as it was.
_HEADERS_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
RACY_NS = 3_000_000_000


def check_against_headers(plan, files: tuple | None = None) -> None:
    """Every byte range the plan reads is where the checkpoint's own headers put the tensor it names:
    the same file, the same dtype, inside that tensor's bytes (a whole read: exactly them, with its
    shape). A plan file edited to read one tensor's bytes as another's is a `PlanFormatError` (exit 2)
    before anything is allocated, and `--verify` (which reads at the plan's offsets) then compares
    against the checkpoint as its headers describe it. Only the headers are read. `files`: the
    files' identities now (`check_fingerprints`); a plan found to match them before is not read again
    (any write to a file moves its ctime, which no one can set back; files written in the last
    `RACY_NS` are read every time)."""
    if files is not None and _HEADERS_CHECKED.get(plan) == files:
        return
    settled = files is not None and all(time.time_ns() - max(f[3], f[4]) > RACY_NS for f in files)
    import math

    from ...base.errors import PlanFormatError
    from ...manifest import read_manifest
    from ...manifest.ggml_types import QUANTIZED, quant_type

    root = plan.checkpoint.root
    headers, metadata = {}, {}
    for f in plan.checkpoint.files:
        m = read_manifest(os.path.join(root, f.path))
        headers[f.path] = {t.name: t for t in m.tensors}
        metadata[f.path] = dict(m.shards[0].metadata) if m.shards else {}
    for part in plan.parts:
        for i in part.inputs:
            entry = headers.get(i.file, {}).get(i.tensor)
            where = f"plan part {part.tensor}#{part.index} reads {i.tensor!r} from {os.path.join(root, i.file)}"
            if entry is None:
                raise PlanFormatError(f"{where}, whose header has no such tensor; compile again",
                                      code=Code.PLAN_HEADER_MISMATCH)
            last = i.start + ((i.count - 1) * i.stride + i.seg if i.count > 1 else i.nbytes)
            whole = i.count == 1 and i.nbytes == entry.nbytes
            dtype, shape = entry.dtype, tuple(entry.shape)
            if dtype in QUANTIZED:  # GGUF blocks: read as U8 rows of whole blocks, their type the part's
                qt = quant_type(dtype)
                dtype, shape = "U8", (math.prod(shape[:-1]), shape[-1] // qt.block * qt.block_bytes)
                if part.ggml != entry.dtype:
                    raise PlanFormatError(f"{where} as GGML {part.ggml or 'nothing'}, but the file's header says "
                                          f"{entry.dtype}; the plan does not match its checkpoint: compile again",
                                          code=Code.PLAN_HEADER_MISMATCH)
            elif part.ggml:
                raise PlanFormatError(f"{where} as GGML {part.ggml}, but the file's header says {entry.dtype}; the "
                                      f"plan does not match its checkpoint: compile again", code=Code.PLAN_HEADER_MISMATCH)
            if part.unpermute:  # rows per head written in transformers' order: the file's heads
                _unpermute_matches(part, i, entry, metadata[i.file], where)
            if (i.dtype != dtype or i.start < entry.start or last > entry.start + entry.nbytes
                    or (whole and (i.start != entry.start or tuple(i.shape) != shape))):
                raise PlanFormatError(
                    f"{where} at bytes [{i.start:,}, {last:,}) as {i.dtype} {list(i.shape)}, but the file's header puts "
                    f"it at [{entry.start:,}, {entry.start + entry.nbytes:,}) as {entry.dtype} {list(entry.shape)}; "
                    f"the plan does not match its checkpoint: compile again", code=Code.PLAN_HEADER_MISMATCH)
    if settled:
        _HEADERS_CHECKED[plan] = files


def _unpermute_matches(part, i, entry, metadata, where: str) -> None:
    """A part that writes a GGUF q / k weight's rows in transformers' order by heads of `unpermute`
    rows: the file's header must make the tensor a permuted one with heads of that many rows (the
    plan's figure alone could put rows in a wrong order and --verify, which follows the plan, agree)."""
    from ...base.errors import PlanFormatError
    from ...manifest.gguf_names import permuted_heads

    try:
        n_head = permuted_heads(i.tensor, metadata)
    except (KeyError, ValueError) as e:
        n_head, why = None, f" ({str(e.args[0])[:120]})"
    else:
        why = ""
    rows = entry.shape[0] if entry.shape else 0
    hd = rows // n_head if n_head and rows % n_head == 0 else None
    if hd != part.unpermute:
        said = f"heads of {hd} rows" if hd else f"no permuted q / k rows{why}"
        raise PlanFormatError(f"{where} unpermuting heads of {part.unpermute} rows, but the file's header gives "
                              f"{said}; the plan does not match its checkpoint: compile again",
                              code=Code.PLAN_HEADER_MISMATCH)


def admit_live(plan, room, dev, reused_bytes: int = 0, verify: bool = False, kept_bytes: int = 0) -> tuple:
    """The whole plan against the live room (`room`, a `memory.LiveRoom`) and free device memory of
    `dev` (a `seam.Device`); returns (room, the device's (free, total) bytes or None).
    `reused_bytes`: device bytes the load writes into without allocating them (a reload's arena).
    `kept_bytes`: bytes of its ring pinned already (`io.ring.KEPT`): held, so not wanted from the room.
    With `verify`, what `--verify` holds after the load (`planc.plan.verifycost`) counts too, where it is
    more than the load's host peak."""
    need = plan.peak.host_bytes - kept_bytes
    what = "the plan's host peak" + (f" less {kept_bytes:,} bytes of its ring kept pinned" if kept_bytes else "")
    if verify:
        from ...plan.verifycost import verify_host_bytes

        v = verify_host_bytes(plan)
        if v > need:
            need, what = v, "what --verify holds (planc.plan.verifycost)"
    if dev.memory_is_host:  # the simulator's device memory is host memory: the regions count against the room
        need += plan.layout.device_bytes - reused_bytes
        what = "the plan's host peak plus its simulated device regions"
    if need > room.room_bytes:
        raise AdmissionError.of(Refusal(
            Code.LIVE_ROOM, 0, ALLOC_RING, need, room.room_bytes,
            f"refused before allocating: {what} is {need:,} bytes ({gib(need)}), the live room is "
            f"{room.room_bytes:,} bytes ({gib(room.room_bytes)}: {room.terms()}); "
            f"{room.hint(need, 'lower io.slots/io.slot or io.run')}"))
    info = dev.memory_info()
    dev_need = plan.peak.device_bytes - reused_bytes
    if info is not None and dev_need > info[0]:
        raise AdmissionError.of(Refusal(
            Code.DEVICE_ROOM, 0, ALLOC_DEVICE, dev_need, info[0],
            f"refused before allocating: the plan needs {dev_need:,} bytes ({gib(dev_need)}) of device memory, "
            f"{plan.device} has {info[0]:,} bytes ({gib(info[0])}) free; skip tensors or load a smaller dtype"))
    return room, info


def resolve_settings(settings):
    """The load's `Settings`: the environment's with `settings` over them (a bad variable in the
    environment: SpecError `bad-env`; a bad argument: SettingError)."""
    from ...base.errors import SpecError
    from ...base.settings import SettingError, Settings

    try:
        return Settings.resolve(settings)
    except SettingError as e:
        if e.from_env:
            raise SpecError(str(e), code=Code.BAD_ENV) from None
        raise


def execute(plan: "Plan", *, progress: bool = False, verify: bool = False, device=None,
            settings=None, observer=None, parts=None, timings=None, digest=None, into=None):
    """Load `plan` onto the device. Returns a LoadedModel; raises a PlancError subclass on failure.

    `device`: where the load goes. A name (`cuda`, `cuda:N`: that index of the process's device,
    `seam.default_device()`), or a `seam.Device` (a `Gpu`, a `Simulator`, or a test's wrapper of
    one: it owns the memory, streams, copies, launches and launch geometry of the load, at the
    plan's device index); None: the plan's device on the process's device.

    `settings`: a `planc.base.settings.Settings`, or name -> value over the environment's
    (`{"host_reserve": "1GiB", "raw_launch": False, "kernel_dir": "/tmp/k"}`), resolved once here and
    in force for this call only (this thread, and the threads the load starts). `digest`: a digest
    file's path (or a read `planc.manifest.digest.Digest`) that every byte read is hashed against as it passes
    through the ring (`planc.manifest.digest`); a mismatch is a `DigestError` and no model. `into`: a
    `reload.Into`, the device memory the load writes into instead of a new arena. `observer`: called
    with each `events` record of the load. `parts`: the `parts.Parts` the pipeline is composed of
    (default: the real ones). `timings`: phases timed before this call (the API's compile), put
    in the report as they are."""
    from ...base import settings as _settings
    from ...plan.codec import checked

    from ..device import seam

    plan = checked(plan)  # a Plan edited or built by the caller goes through the plan file's checks
    s = resolve_settings(settings)
    if device is None or isinstance(device, str):
        dev, name = seam.default_device(), device
    else:
        dev, name = device, None
    with _settings.using(s), seam.using(dev):
        return _execute(plan, progress=progress, verify=verify, device=name, dev=dev, settings=s,
                        observer=observer, parts=parts, before=timings or {}, digest=digest, into=into)


def _execute(plan: "Plan", *, progress: bool, verify: bool, device: str | None, dev, settings, observer, parts,
             before, digest=None, into=None):
    from ..device import launch
    from .events import LoadEnded, Step, Timed, fanout
    from .loader import Pipeline
    from .meter import Meter
    from ..device.memory import hwm_bytes, reset_hwm, rss_bytes
    from .model import DeviceTensor, LoadedModel
    from .records import LoadMemory, Prediction, Report
    from ...base.device import device_arg
    from ..device.seam import index_of, release, release_later, settle_released
    from ..io.ring import KEPT

    t_call = time.perf_counter()
    if not plan.fits:
        raise AdmissionError.of(plan.refusal)
    from . import parts as _parts

    parts = parts or _parts.DEFAULT
    if into is not None:
        import dataclasses

        parts = dataclasses.replace(parts, regions=into.regions)
    t_prep = time.perf_counter()
    settle_released()  # an earlier load's ring is unpinned before this one measures and admits
    check_against_headers(plan, check_fingerprints(plan))
    verifier = _verifier(plan, digest)
    dev_name = plan.device if device is None else device_arg(device)
    idx = index_of(dev_name)
    dev.select(idx)  # attaches to its primary context (made here if no one made it yet)
    slot = plan.io.slot_bytes
    kept = KEPT.take(dev, slot, plan.layout.ring_bytes // slot)  # pinned already: the load's from now
    try:
        room, _ = admit_live(plan, parts.live_room(settings.host_reserve), dev,
                             into.arena_bytes if into is not None else 0, verify, len(kept) * slot)
    except BaseException:
        release_later(KEPT.give(dev, slot, kept))  # refused: what was kept stays kept
        raise
    base_rss = rss_bytes()
    hwm_reset = reset_hwm()
    free_before = dev.memory_info()
    kernel_code = dev.kernel_stats()
    meter = Meter()  # the load's counts and timings, folded from its events
    prepared = time.perf_counter()
    bar = _progress(plan) if progress else None
    observer = fanout(meter, bar[2] if bar else None, parts.observer, observer)
    observer(Timed("prepare", start=t_prep, end=prepared))
    # The pipeline's parts, built here, in this order (each started as soon as it can be: `Regions`)
    stream = regions = warmer = reader = pool = kernels = pipeline = None
    t0 = time.perf_counter()
    try:
        try:
            stream = dev.stream()
            regions = parts.regions(plan, dev, stream, observer)
            regions.pinned, kept = kept, None
            warmer = parts.warmer(plan, dev)
            reader = parts.reader(plan)
            if verifier is not None:
                from ..io import digestread, readhash

                native = readhash.load() if settings.digest_hash != "python" else None
                reader = digestread.DigestReader(reader, verifier, native, simd=settings.digest_hash)
            pool = parts.pool(plan)
            regions.pin_ring()
            kernels = parts.kernels(plan, dev, stream, regions, warmer, observer)
            host = parts.host(plan, dev, stream, regions, reader, observer)
            pipeline = Pipeline(plan, dev=dev, stream=stream, regions=regions, reader=reader, submit=pool.submit,
                                kernels=kernels, host=host, live_room=lambda run: parts.live_room(settings.host_reserve, run=run),
                                observer=observer)
            observer(Step("allocate", start=t0))
            if bar:
                bar[0].start()
            pipeline.run()
            digested = verifier.finish() if verifier is not None else None
            free_alloc = dev.memory_info()  # arena, landing and staging all still held
        finally:
            if bar:
                bar[0].stop()
        wall = time.perf_counter() - t0
        arena = regions.take_arena()
        t_free = time.perf_counter()
        _close(regions, warmer, kernels, pool, reader, stream, pipeline, full=False)
        observer(Step("free", start=t_free))
    except PlancError as e:
        _drop_frames(e)
        _close(regions, warmer, kernels, pool, reader, stream, pipeline)
        observer(LoadEnded(False, type(e).__name__, start=t0))
        raise
    except KeyboardInterrupt as e:
        _drop_frames(e)
        _close(regions, warmer, kernels, pool, reader, stream, pipeline)
        observer(LoadEnded(False, "Interrupted", start=t0))
        raise Interrupted("interrupted during the load; everything allocated was released") from None
    except Exception as e:  # noqa: BLE001 - any device or runtime failure: release, then a typed error
        _drop_frames(e)
        _close(regions, warmer, kernels, pool, reader, stream, pipeline)
        observer(LoadEnded(False, "ExecuteError", start=t0))
        raise ExecuteError(f"load failed: {type(e).__name__}: {e}; everything allocated was released",
                           code=Code.LOAD_FAILED) from e
    hwm = hwm_bytes()
    tensors = {t.name: DeviceTensor(t.name, t.dtype, t.shape, t.offset_bytes, t.nbytes, arena, idx, dev)
               for t in plan.tensors}
    t_rel = time.perf_counter()
    release(full=False, settle=False)
    observer(Timed("release", start=t_rel))
    rss_after = rss_bytes()
    checked = None
    if verify:
        from .verify import verify_model

        unchecked = LoadedModel(tensors, None, arena, dev.simulated, load=execute)
        try:
            checked = verify_model(plan, unchecked)
        except BaseException:
            del tensors, arena
            unchecked.free()
            raise
        del unchecked
    if before:  # the phases before this call, and this call's own time next to them
        for phase, seconds in before.items():
            meter.record(phase, seconds)
        meter.record("execute", time.perf_counter() - t_call)
    memory = LoadMemory(pinned_by=dev.pin_method(), baseline_rss_bytes=base_rss, hwm_bytes=hwm, hwm_reset=hwm_reset,
                        rss_after_bytes=rss_after, live_room_bytes=room.room_bytes, free_before=free_before,
                        free_alloc=free_alloc, kept_ring_bytes=regions.kept_bytes)
    report = Report.build(plan, meter, memory, reader, Prediction.of(plan, wall), device=dev_name,
                          simulator=dev.simulated, wall=wall, kernel_code=launch.since(kernel_code, dev.kernel_stats()),
                          verify=checked, digest=digested)
    observer(LoadEnded(True, start=t0))
    return LoadedModel(tensors, report, arena, report.simulator, load=execute)


def import_parts() -> None:
    """Import what a load imports on its first use (its parts, the device's launcher, the report), so
    that a process's first load does not spend its time there (`planc.warm_up`)."""
    import importlib

    for name in ("...plan.predict", "..device.launch", "..device.memory", ".loader", ".meter", ".model", ".parts",
                 ".records"):
        importlib.import_module(name, __package__)


def _verifier(plan, digest):
    """The load's `planc.manifest.digestcheck.Verifier` (None without `digest`), its files' fingerprints checked."""
    if digest is None or digest is False:
        return None
    from ...manifest.digest import Digest, find_default, read_digest
    from ...manifest.digestcheck import Verifier

    if digest is True:
        digest = find_default(plan.checkpoint)
    d = digest if isinstance(digest, Digest) else read_digest(digest)
    v = Verifier(plan, d)
    v.check_files()
    return v


def _close(regions, warmer, kernels, pool, reader, stream, pipeline, full: bool = True) -> None:
    """Stop and release every part of a load that was built (None: not built), also after a failure;
    a failed load (`full`) drops its arena too. A finished load keeps its arena (`take_arena` has
    handed it over); while its ring is kept, its readers' threads are kept too (idle, for the next
    load: `io.readers.KEPT_READERS`)."""
    from ..io.readers import Readers, hand_back
    from ..io.ring import KEPT

    if regions is not None:
        regions.stop()
    if kernels is not None:
        kernels.join_warmer()
    elif warmer is not None:
        warmer.join()
    keep = not full and isinstance(pool, Readers) and regions is not None
    if pool is not None and not keep:
        pool.shutdown(wait=True, cancel_futures=True)
    if reader is not None:
        reader.close()
    for sync in (stream, kernels):  # each on its own: the kernels' stream waited for even if the load's fails
        try:
            if sync is not None:
                sync.synchronize()
        except Exception:  # noqa: BLE001 - the device may already be in error; still drop what we hold
            pass
    if pipeline is not None:
        pipeline.close()
    if regions is not None:
        regions.free(full)
        if full:
            regions.drop_arena()
    elif full:
        from ..device.seam import release

        release()
    if keep:  # last: idle now, kept beside the ring for the next load while rings are kept
        ring_kept = regions.keep_ring
        hand_back(pool, lambda: ring_kept or KEPT.keeping)  # not kept: ended as any load's


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

    def observe(event) -> None:  # the load's observer: bytes as they are copied, parts as they are done
        from .events import CopyIssued, HostPartDone, KernelsLaunched

        if isinstance(event, CopyIssued) and event.request is not None:
            p.update(task, advance=event.nbytes)
        elif isinstance(event, (KernelsLaunched, HostPartDone)):
            done[0] += 1 if isinstance(event, HostPartDone) else event.parts
            p.update(task, advance=event.nbytes if isinstance(event, HostPartDone) else 0, parts=done[0])

    return p, task, observe
