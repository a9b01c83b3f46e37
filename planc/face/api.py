"""The Python API: a spec, a saved plan or a `Plan` -> a `LoadedModel`, or a ready PyTorch module.

    model = planc.load("specs/transformers-llama.yaml")         # compile, admit, execute
    tensors = model.state_dict()                                  # name -> torch.Tensor, no copy
    result = planc.load_into(meta_module, "plan.json")            # fill a meta-device module

What the target is (a spec, a plan file, a `Plan`), its rank and the launcher's variables are
resolved by `planc.face.target.resolve`, as for the command line: one input, one answer or one error on
both. A spec is compiled, a plan file read; both then run through `planc.execute.execute`. Nothing here imports torch or numba until it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import BindError, HandoffError, SpecError
from ..base.codes import Code
from ..base.verifyarg import verify_arg as _verify_arg


def _plan(spec_or_plan, rank: int | None):
    """The plan to load (`planc.face.target.resolve`, as for the command line), for `rank=`."""
    from .target import resolve

    if rank is not None:
        rank = _rank_arg(rank)
    return resolve(spec_or_plan, rank, flag="rank=")


def _rank_arg(rank) -> int:
    """`rank=` as an int 0 or more (numpy integers too; not a bool), else a typed error."""
    import operator

    try:
        r = operator.index(rank) if not isinstance(rank, bool) else -1
    except TypeError:
        r = -1
    if r < 0:
        raise BindError(f"rank must be an integer 0 or more, got {str(rank)[:40]!r}", code=Code.BAD_RANK)
    return r



def load(spec_or_plan, *, rank: int | None = None, device: str | None = None, verify=False,
         progress: bool = False, settings=None, digest=None):
    """Load a checkpoint onto the device. Returns a `LoadedModel` (name -> device tensor, `.report`).

    `spec_or_plan`: a spec file (YAML or JSON: compiled for `rank`, default `$RANK` when the spec
    is tensor parallel, else 0), a plan file written by `planc compile -o`, or a `Plan`.
    `device` overrides the spec's (`cuda:1`); `verify=True` compares every loaded byte with the
    checkpoint after the load (`report.verify`); `verify="digest"` hashes every byte read as it
    passes through the ring and compares it with the digest file `digest` (default: the one
    `planc digest` writes beside the checkpoint; `report.digest`): a mismatch is a
    `DigestError` and no model (docs/reload.md). `settings` (a `planc.base.settings.Settings`, or name -> value:
    `host_reserve`, `raw_launch`, `kernel_dir`, `kernel_cache`, `probe`, `debug`, `pin`) are resolved
    once, over the PLANC_* variables, and hold for this call only (compile included), in this thread
    alone. Raises a `PlancError` subclass: a refused plan is an `AdmissionError`
    before anything is allocated; a setting that does not exist or cannot take its value is a
    `SettingError` (a ValueError) before anything is read.
    """
    import time

    from ..base import settings as _settings
    from ..execute import execute

    if device is not None:
        from ..base.device import device_arg

        device = device_arg(device)  # before a spec is compiled
    from ..execute.pipeline.run import resolve_settings

    verify, digest = _verify_arg(verify, digest)
    s = resolve_settings(settings)  # once, before anything is read; compile and execute both see it
    with _settings.using(s):
        t0 = time.perf_counter()
        plan = _plan(spec_or_plan, rank)
        t1 = time.perf_counter()
        model = execute(plan, verify=verify, device=device, progress=progress, settings=s,
                        timings={"plan": t1 - t0}, digest=digest)
    model.resolve = _plan  # its reload takes what load takes: a spec, a plan file or a Plan
    return model


def warm_up(spec_or_plan, *, rank: int | None = None, device: str | None = None, settings=None,
            ring: bool = True):
    """Get the process ready for fast loads of `spec_or_plan` (what `load` takes): the plan compiled
    (or read), the device's context made, the executor's modules imported, and with `ring` (the
    default) the plan's pinned ring pinned now and kept (`planc.execute.io.ring.KEPT`), so that the
    loads of this process on that device take it pinned instead of pinning their own, and give it
    back when they are done, until `release_ring()`; its `io.workers` readers' threads are started
    and kept with it (`planc.execute.io.readers.KEPT_READERS`) the same way. Returns the `Plan`
    (load it with `load`, no compile again). A kept ring is host memory held from now on: it is admitted against the live
    room like a load's (an `AdmissionError` when it does not fit), and each load's report counts it in
    its host growth (`host.kept_ring_bytes`)."""
    from ..base import settings as _settings
    from ..base.device import device_arg
    from ..base.errors import AdmissionError, ExecuteError, PlancError
    from ..base.units import gib
    from ..execute.device import seam
    from ..execute.device.memory import live_room
    from ..execute.io import readers
    from ..execute.io.readers import KEPT_READERS
    from ..execute.io.ring import KEPT
    from ..execute.pipeline.run import import_parts, resolve_settings
    from ..plan.records import ALLOC_RING, Refusal

    if not isinstance(ring, bool):
        raise BindError(f"ring= must be True or False, got {type(ring).__name__} {str(ring)[:40]!r}",
                        code=Code.BAD_RING)
    if device is not None:
        device = device_arg(device)
    s = resolve_settings(settings)
    with _settings.using(s):
        plan = _plan(spec_or_plan, rank)
        if not plan.fits:
            raise AdmissionError.of(plan.refusal)
        dev = seam.default_device()
        dev.select(seam.index_of(device or plan.device))
        import_parts()
        if not ring:
            return plan
        seam.settle_released()  # an earlier load's ring unpinned before the room is measured
        slot = plan.io.slot_bytes
        n = plan.layout.ring_bytes // slot
        missing = n - min(n, KEPT.available(dev, slot))
        room = live_room(s.host_reserve)
        if missing * slot > room.room_bytes:
            raise AdmissionError.of(Refusal(
                Code.LIVE_ROOM, 0, ALLOC_RING, missing * slot, room.room_bytes,
                f"refused before pinning: the plan's ring is {missing * slot:,} bytes ({gib(missing * slot)}), the "
                f"live room is {room.room_bytes:,} bytes ({gib(room.room_bytes)}: {room.terms()}); "
                f"{room.hint(missing * slot, 'lower io.slots/io.slot')}"))
        pool = KEPT_READERS.take(plan.io.workers)  # the readers' threads, kept beside the ring
        if pool is None:
            try:
                pool = readers.start(plan.io.workers)
            except (RuntimeError, OSError) as e:  # no thread to be had: nothing kept, nothing pinned
                raise ExecuteError(f"starting the plan's {plan.io.workers} readers' threads failed: {e}; nothing "
                                   f"was kept that was not kept before", code=Code.LOAD_FAILED) from None
        taken = KEPT.take(dev, slot, n)
        pairs = list(taken)
        try:
            while len(pairs) < n:
                pairs.append(seam.pinned_ring(dev, slot))
        except BaseException as e:  # what was kept stays kept; what was pinned here is unpinned
            pinned, pairs = pairs[len(taken):], None
            seam.release_later(KEPT.give(dev, slot, taken) + pinned)
            del pinned, taken
            readers.hand_back(pool, lambda: KEPT.keeping)  # kept again only if it was
            if isinstance(e, (PlancError, KeyboardInterrupt)):
                raise
            raise ExecuteError(f"pinning the plan's ring failed: {type(e).__name__}: {e}; nothing was kept "
                               f"that was not kept before", code=Code.HOST_MEMORY) from None
        KEPT.keep(True)
        seam.release_later(KEPT.give(dev, slot, pairs))
        readers.hand_back(pool, lambda: KEPT.keeping)  # a release_ring since: not kept
    return plan


def release_ring() -> int:
    """Give back the pinned ring `warm_up` (or PLANC_RING=kept) kept, and end the readers' threads
    kept with it; returns the ring's bytes. Later loads pin their own again and start their own
    readers, and give both back when they are done (unless PLANC_RING=kept)."""
    from ..execute.device.seam import release
    from ..execute.io.readers import KEPT_READERS
    from ..execute.io.ring import KEPT

    n = KEPT.held_bytes()
    pairs = KEPT.drop()
    del pairs
    release()
    pool = KEPT_READERS.drop()
    if pool is not None:
        pool.shutdown(wait=True)
    return n


@dataclass
class LoadResult:
    """What `load_into` did. `missing_keys` and `unexpected_keys` as `load_state_dict` reports them."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    tied: list[list[str]]  # names sharing one loaded parameter (kept tied)
    rebuilt_buffers: list[str]  # non-persistent buffers made by their module's own initialisation
    uninitialized_buffers: list[str]  # left on the meta device (strict=False only)
    report: object  # the load's measured report (`Report`), with the hand-off's own timings
    model: object  # the LoadedModel whose arena holds the tensors


def load_into(module, spec_or_plan, *, strict: bool = True, rank: int | None = None, device: str | None = None,
              verify=False, settings=None, inplace: bool = False, digest=None) -> LoadResult:
    """Load into `module` (built on the meta device) by assignment, without a copy on a GPU.

    Parameters and persistent buffers take the loaded tensors; tied parameters stay tied;
    non-persistent buffers (rotary `inv_freq`) are rebuilt by their module's own initialisation.
    With `strict` (the default) missing or unexpected keys, or buffers that cannot be rebuilt, raise
    a `HandoffError` and the device memory is released; shapes must always match. `settings`,
    `verify` and `digest` as for `load`.

    `inplace=True`: `module` already holds its tensors on the device (loaded by planc or by anything
    else); the new weights are written into the module's own storage (every `data_ptr()` kept, no
    new arena), tied weights and buffers left as they are. Each tensor the plan loads must be a
    parameter or persistent buffer of the module with the same shape and dtype, contiguous; the plan
    must be of copies only (no conversion on the device). `result.model` is None.
    """
    if inplace:
        return _load_inplace(module, spec_or_plan, rank=rank, device=device, verify=verify, settings=settings,
                             digest=digest)
    from .torch import assign, import_torch

    torch = import_torch()  # before anything is loaded: without torch there is nothing to load into
    if not isinstance(module, torch.nn.Module):
        raise HandoffError(f"load_into needs a torch.nn.Module (built on the meta device), got "
                           f"{type(module).__name__}", code=Code.NOT_A_MODULE)
    import time

    model = load(spec_or_plan, rank=rank, device=device, verify=verify, settings=settings, digest=digest)
    try:
        t0 = time.perf_counter()
        tensors = model.state_dict()
        t1 = time.perf_counter()
        done = assign(module, tensors, strict)
        report = model.report.with_timings(state_dict=t1 - t0, assign=time.perf_counter() - t1)
    except BaseException:
        model.free()
        raise
    return LoadResult(done.missing_keys, done.unexpected_keys, done.tied, done.rebuilt_buffers,
                      done.uninitialized_buffers, report, model)


def _load_inplace(module, spec_or_plan, *, rank, device, verify, settings, digest) -> LoadResult:
    """`load_into(..., inplace=True)`: the plan's copies written into the module's own tensors."""
    import time

    from .torch import _tied_groups, import_torch

    torch = import_torch()
    if not isinstance(module, torch.nn.Module):
        raise HandoffError(f"load_into needs a torch.nn.Module, got {type(module).__name__}", code=Code.NOT_A_MODULE)
    verify, digest = _verify_arg(verify, digest)
    if verify:
        raise HandoffError("load_into(inplace=True) verifies with verify='digest' (hashing as it streams), not "
                           "verify=True", code=Code.BAD_VERIFY)
    from ..base import settings as _settings
    from ..execute import execute
    from ..execute.pipeline.run import resolve_settings
    from ..execute.pipeline.reload import Into, ModuleArena, ReusedRegions, check_inplace
    from .inplace import module_targets
    from ..execute.device.seam import default_device

    s = resolve_settings(settings)
    with _settings.using(s):
        t0 = time.perf_counter()
        plan = _plan(spec_or_plan, rank)
        check_inplace(plan)
        targets, written = module_targets(module, plan, default_device().memory_is_host)
        arena = ModuleArena(targets, plan.layout.arena_bytes)

        def regions(plan_, dev, stream, observer):
            return ReusedRegions(arena, None, plan_, dev, stream, observer)

        t1 = time.perf_counter()
        model = execute(plan, device=device, settings=s, digest=digest, timings={"plan": t1 - t0},
                        into=Into(regions, plan.layout.arena_bytes))
    report = model.report
    model.tensors, model._arena = {}, None  # the memory is the module's
    state = module.state_dict(keep_vars=True)
    missing = sorted(n for n in state if n not in written and not any(
        n in g and any(m in written for m in g) for g in _tied_groups(module)))
    tied = [sorted(g) for g in _tied_groups(module) if any(n in written for n in g)]
    return LoadResult(missing, [], tied, [], [], report, None)
