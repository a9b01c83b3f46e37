"""New weights into memory that already holds a model: a live `LoadedModel` + a spec or plan of the
same layout -> the same arena, rewritten (`reload_model`); a torch module's own tensors + a plan
-> those tensors, rewritten (`ModuleArena`, used by `planc.load_into(..., inplace=True)`).

Invariants:
- before any byte is written, the new plan is checked against the live layout (`check_layout`:
  tensor names, dtypes, shapes, arena offsets and sizes, the arena's size and its zero-filled
  padding) and the live device (`check_device`: the plan's or `device=`'s index); the first
  difference is a `ReloadError` (exit 2) and the model is untouched;
- the load is the ordinary pipeline (fingerprints, re-admission of host memory, runs, digest
  verification), composed with regions that write into the given memory (`ReusedRegions`): no
  device allocation for the arena (landing and staging regions, when the plan has them, are
  allocated and freed as in any load);
- a failure once writing may have begun (the regions' first `ready`) leaves the model torn:
  `LoadedModel.torn` says why and every read of it raises `TornModelError` until a reload
  succeeds. A failure before (a changed file, a refused admission, a bad digest file) leaves the
  model as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...base.errors import HandoffError, PlancError, ReloadError
from .allocation import Regions
from ...base.codes import Code


@dataclass(frozen=True)
class Into:
    """What `execute(..., into=)` writes into: `regions` (the `Parts.regions` factory that hands the
    memory over) and the device bytes it does not allocate (`arena_bytes`)."""

    regions: Callable
    arena_bytes: int


class ReusedRegions(Regions):
    """A load's regions whose arena is memory that exists already (`arena`): nothing allocated for
    it, nothing of it freed. `on_write` is called once, before the first byte can be written."""

    def __init__(self, arena, on_write, *a, **k):
        self._given, self._on_write = arena, on_write
        super().__init__(*a, **k)

    def _allocate_device(self) -> None:
        self.arena = self._given
        self._allocate_regions()

    def ready(self) -> None:
        if self.device_job is not None and self._on_write is not None:
            self._on_write()
            self._on_write = None
        super().ready()

    def drop_arena(self) -> None:
        self.arena = None  # the memory is its owner's: only this reference goes


def check_layout(tensors: dict, arena_bytes: int, zero, plan) -> None:
    """The plan against a live layout (`tensors`: name -> DeviceTensor-like with dtype, shape,
    offset_bytes, nbytes); the first difference, in name order, is a `ReloadError`."""
    where = f"the plan of {plan.checkpoint.source}"
    new = {t.name: t for t in plan.tensors}
    for name in sorted(set(tensors) | set(new)):
        a, b = tensors.get(name), new.get(name)
        if a is None:
            raise ReloadError(f"{where} has a tensor the live model lacks: {name!r}; nothing was written",
                              code=Code.RELOAD_LAYOUT)
        if b is None:
            raise ReloadError(f"{where} lacks the live model's tensor {name!r}; nothing was written",
                              code=Code.RELOAD_LAYOUT)
        for field, old, got in (("dtype", a.dtype, b.dtype), ("shape", list(a.shape), list(b.shape)),
                                ("arena offset", a.offset_bytes, b.offset_bytes), ("bytes", a.nbytes, b.nbytes)):
            if old != got:
                raise ReloadError(f"{where}: tensor {name!r} {field} {got}, the live model's is {old}; "
                                  f"nothing was written", code=Code.RELOAD_LAYOUT)
    if plan.layout.arena_bytes != arena_bytes:
        raise ReloadError(f"{where}: arena of {plan.layout.arena_bytes:,} bytes, the live model's is {arena_bytes:,}; "
                          f"nothing was written", code=Code.RELOAD_LAYOUT)
    if zero is not None and tuple(map(tuple, plan.layout.zero)) != tuple(map(tuple, zero)):
        raise ReloadError(f"{where}: zero-filled padding {list(plan.layout.zero)}, the live model's is {list(zero)}; "
                          f"nothing was written", code=Code.RELOAD_LAYOUT)


def check_device(model, plan, device) -> None:
    """The reload's device (`device=`, else the plan's) against the device the live model's memory
    is on: a load on another device would write this one's memory from that one's context."""
    from ...base.device import device_arg
    from ..device.seam import index_of

    if device is not None and not isinstance(device, str):
        return  # a `seam.Device` given by a test: its own index
    live = {t.device_index for t in model.tensors.values()}
    name = plan.device if device is None else device_arg(device)
    if live and index_of(name) not in live:
        where = "device=" if device is not None else "the plan's device"
        raise ReloadError(f"{where} {name} is not the live model's device cuda:{min(live)}; a reload writes "
                          f"the memory the model is in; nothing was written", code=Code.RELOAD_LAYOUT)


def reload_model(model, plan, *, load, device=None, verify=False, digest=None, settings=None):
    """`LoadedModel.reload` of a resolved `plan`: see the module's docstring. `load`: the function that
    loads a plan (`execute`), run here into the model's memory. Returns the new report."""
    from ...plan.codec import checked

    if model._arena is None:
        raise ReloadError("the model was freed: there is no memory to reload into; load it again", code=Code.RELOAD_FREED)
    plan = checked(plan, "the reload's plan")
    arena_bytes = model.report.device_memory.arena_bytes
    check_layout(model.tensors, arena_bytes, None, plan)
    check_device(model, plan, device)
    state, began = model._state, []

    def regions(plan_, dev, stream, observer):
        return ReusedRegions(model._arena, lambda: began.append(True), plan_, dev, stream, observer)

    try:
        fresh = load(plan, verify=verify, device=device, settings=settings, digest=digest,
                     into=Into(regions, arena_bytes))
    except BaseException as e:
        if began:
            state.torn = f"a reload from {plan.checkpoint.source} failed while writing: " \
                         f"{e.message if isinstance(e, PlancError) else type(e).__name__}"
        raise
    state.torn = None
    model.report = fresh.report
    fresh.tensors, fresh._arena = {}, None  # the memory stays the model's
    return model.report


# -- a torch module's own tensors as the arena ---------------------------------------------------


class ModuleArena:
    """The arena of a load into tensors that exist already (a torch module's, each its own
    allocation): arena offset -> the tensor placed there. Copies (`Device.stage`) that span several
    tensors are split at their boundaries (`pieces`); a plan with device kernels, scatters or
    zero-filled padding is refused (`check_inplace`), as those address the arena as one range.

    `targets`: (arena offset, bytes, destination) sorted by offset, where a destination is a uint8
    device array of exactly those bytes (on a GPU a `driver.DeviceArray` over the tensor's pointer;
    under the simulator a host view of the CPU tensor with the simulator's `copy_to_device`)."""

    def __init__(self, targets: list, nbytes: int):
        import bisect

        self.targets, self.nbytes = targets, nbytes
        self._starts = [t[0] for t in targets]
        self._bisect = bisect.bisect_right

    def pieces(self, off: int, n: int):
        """(destination, offset in it, offset in the copy, bytes) of arena bytes [off, off + n); bytes
        that fall between tensors (the arena's alignment padding) belong to none and are not written."""
        out, end = [], off + n
        i = max(0, self._bisect(self._starts, off) - 1)
        while i < len(self.targets) and self.targets[i][0] < end:
            start, size, dst = self.targets[i]
            lo, hi = max(off, start), min(end, start + size)
            if lo < hi:
                out.append((dst, lo - start, lo - off, hi - lo))
            i += 1
        return out


def check_inplace(plan) -> None:
    lay = plan.layout
    bad = [why for why, n in (("device kernels (a conversion, a dequantization or a transpose)", plan.totals.kernels),
                              ("landing regions", lay.landing_bytes), ("scattered requests", lay.staging_bytes),
                              ("zero-filled padding", len(lay.zero)))
           if n]
    if any(c.rows > 1 for run in plan.runs for r in run.requests for c in r.copies):
        bad.append("2-D copies (a rank's slice of a later dim)")
    if bad:
        raise HandoffError(f"load_into(inplace=True) writes copies only into the module's own tensors; the plan has "
                           f"{', '.join(bad)}: load into a new arena (inplace=False), keep the stored dtype and "
                           f"layout in the spec, or run its conversions on the host (on: host)",
                           code=Code.INPLACE_UNSUPPORTED)
