"""The one seam between the executor and a device: a `Device` owns everything device-side.

A device owns memory (device bytes, host copies to it, pinned ring slots and how they are pinned),
streams, events, copies (1-D and 2-D: `stage`), kernel launch (`launch`, by the kernel's stable
name) and launch geometry (`grid`: the grids and blocks each kernel gets). Two implementations:

* `Gpu` talks to the CUDA driver through ctypes (`planc.execute.device.driver`): the primary context,
  `cuMemAlloc`, `cuMemHostAlloc`, one stream, events, `cuMemcpy*Async`, and kernels launched from
  the machine code shipped with the package (`planc.execute.device.launch`), on full grids. A load on a
  GPU imports no numba.
* `Simulator` runs the same calls on numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), where
  device memory is host memory and kernels run as Python threads on small grids: the CPU test
  suite goes through the same loader, the same copy list and the same kernel dispatch as a GPU.

Whether a process is simulated is decided in `planc.base.simulation` alone (NUMBA_ENABLE_CUDASIM as numba
reads it), which `default_device` asks to choose the device; each device carries its kernel
`target`, which it hands to the kernel modules that build per target. The executor is handed its
device (`execute(plan, device=...)` chooses it and passes it to every part, dispatcher and ring
lane); only the entry points outside a load's parts ask `device()`: the device a load put in force
for its thread and the threads it starts (`using`), else the default. Where behaviour must differ
it asks a capability (`memory_is_host`, `loads_kernels`, `views_empty`), not the kind. Device memory is a flat uint8
array of the implementation (`driver.DeviceArray` or numba's), sliced, viewed and copied alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import threading
from typing import Protocol, runtime_checkable

import numpy as np
from ...base.codes import Code

from ...base import simulation as choice
from .geometry import GpuGrid, SimGrid

ALIGN = 4096  # the ring's slots start at this alignment (O_DIRECT)


@runtime_checkable
class Device(Protocol):
    """What the executor asks of a device (`Gpu`, `Simulator`, or a test's wrapper of one)."""

    simulated: bool  # for what the report and `LoadedModel` say, not for choosing behaviour
    target: str  # what its kernels are built for: `planc.base.simulation.GPU` or `SIM` (handed to the kernel modules)
    memory_is_host: bool  # device memory is host memory: it counts against the host room
    loads_kernels: bool  # a kernel's first launch loads a module (worth loading ahead: the warmer)
    views_empty: bool  # a zero-byte slice can be viewed and shaped (else `empty` makes the array)

    def select(self, idx: int) -> None: ...
    def current_device(self) -> int: ...
    def memory_info(self) -> tuple[int, int] | None: ...
    def compute_capability(self) -> tuple[int, int]: ...
    def sm_count(self) -> int: ...
    def device_bytes(self, nbytes: int): ...
    def to_device(self, host: np.ndarray): ...
    def empty(self, shape, dtype): ...
    def pinned_bytes(self, nbytes: int) -> np.ndarray: ...
    def pin_method(self) -> str: ...
    def stream(self): ...
    def event(self): ...
    def pointer(self, arr) -> int: ...
    def stage(self, buf: np.ndarray, copies, stream) -> int: ...
    @property
    def grid(self): ...
    def launch(self, name: str, grid, block, stream, *args, kernel=None) -> None: ...
    def kernel_stats(self) -> dict: ...
    def prewarm(self, idx: int | None): ...


class Gpu:
    """A CUDA device through the driver API."""

    simulated = False
    target = choice.GPU
    memory_is_host = False
    loads_kernels = True
    views_empty = True

    def __init__(self, launcher=None, cu=None):
        from . import driver

        self.d = driver
        self.cu = cu  # the driver library its pinned memory comes from (None: libcuda; a test's stand-in)
        self.register_refused = False
        self._launcher = launcher  # `launch.Launcher` (None: the process's, `launch.LAUNCHER`)
        self._grid = None

    @property
    def grid(self) -> GpuGrid:
        """Full grids for this GPU's multiprocessors (asked once; the H200's count if it cannot be)."""
        if self._grid is None:
            try:
                sms = int(self.sm_count())
            except Exception:  # noqa: BLE001 - the device cannot be asked: the H200's count
                sms = None
            self._grid = GpuGrid() if sms is None else GpuGrid(sms)
        return self._grid

    @property
    def launcher(self):
        if self._launcher is None:
            from . import launch

            self._launcher = launch.LAUNCHER
        return self._launcher

    def launch(self, name: str, grid, block, stream, *args, kernel=None) -> None:
        """Launch kernel `name` from the shipped machine code (numba's where there is none)."""
        self.launcher.go(self, name, grid, block, stream, *args, kernel=kernel)

    def kernel_stats(self) -> dict:
        """The launcher's module loads so far (`launch.Launcher.stats`)."""
        return self.launcher.stats()

    def prewarm(self, idx: int | None):
        """Start the driver (and device `idx`'s primary context) on a thread of its own."""
        return self.d.prewarm(idx)

    def empty(self, shape, dtype):
        return self.d.device_bytes(0).view(dtype).reshape(shape)

    def select(self, idx: int) -> None:
        self.d.make_current(idx)

    def current_device(self) -> int:
        return self.d.current_device()

    def memory_info(self) -> tuple[int, int] | None:
        return self.d.memory_info()

    def compute_capability(self) -> tuple[int, int]:
        idx = self.current_device()
        return self.d.attribute(self.d.ATTR_CC_MAJOR, idx), self.d.attribute(self.d.ATTR_CC_MINOR, idx)

    def sm_count(self) -> int:
        return self.d.attribute(self.d.ATTR_SM_COUNT, self.current_device())

    def device_bytes(self, nbytes: int):
        return self.d.device_bytes(nbytes)

    def to_device(self, host: np.ndarray):
        return self.d.to_device(host)

    def pinned_bytes(self, nbytes: int) -> np.ndarray:
        """Page-aligned pinned bytes: registered huge pages (PLANC_PIN=register, the default) or
        cuMemHostAlloc (PLANC_PIN=alloc, and wherever the driver refuses a registration)."""
        if self.pin_method() == "register":
            try:
                return self.d.pinned_array(nbytes, "register", self.cu)
            except Exception as e:
                if getattr(e, "code", None) != Code.PIN_REFUSED:
                    raise  # no memory to be had: the load fails, typed, as cuMemHostAlloc's would
                self.register_refused = True  # a driver or VM that registers no host memory: alloc from now on
        return self.d.pinned_array(nbytes, "alloc", self.cu)

    def pin_method(self) -> str:
        """How this process pins a ring slot now: PLANC_PIN, or `alloc` once registration was refused."""
        from ...base import settings

        return "alloc" if self.register_refused else settings.pin()

    def stream(self):
        return self.d.Stream()

    def event(self):
        return self.d.Event()

    def pointer(self, arr) -> int:
        return arr.ptr

    def stage(self, buf: np.ndarray, copies, stream) -> int:
        """Issue the async copies of one slot: (device array, offset, slot offset, bytes, rows, pitch)
        each, a 2-D copy when rows > 1. Returns the bytes moved."""
        if any(hasattr(c[0], "pieces") for c in copies):  # a module's own tensors (`reload.ModuleArena`)
            copies = split_copies(copies)
        host, h, moved = buf.ctypes.data, stream.handle, 0
        copy, copy2d = self.d.copy_h2d, self.d.copy_h2d_2d
        for dst, off, slot_off, n, rows, pitch in copies:
            if rows == 1:
                copy(dst.ptr + off, host + slot_off, n, h)
            else:
                copy2d(dst.ptr + off, host + slot_off, pitch, n, rows, h)
            moved += n * rows
        return moved



class Simulator:
    """numba's CUDA simulator: device arrays are numpy arrays underneath, kernels run as threads."""

    simulated = True
    target = choice.SIM
    memory_is_host = True
    loads_kernels = False
    views_empty = False
    grid = SimGrid()

    def __init__(self):
        from numba import cuda

        self.cuda = cuda

    def launch(self, name: str, grid, block, stream, *args, kernel=None) -> None:
        """Run kernel `name` (its numba source) on the simulator's threads."""
        if kernel is None:
            from .launch import kernel_of

            kernel = kernel_of(name, self.target)
        kernel[grid, block, stream](*args)

    def prewarm(self, idx: int | None):
        return None  # no driver to start

    def kernel_stats(self) -> dict:
        from .launch import no_stats

        return no_stats()  # numba's kernels run as threads: no module is loaded

    def empty(self, shape, dtype):
        return self.cuda.device_array(shape, dtype=dtype)

    def select(self, idx: int) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def memory_info(self) -> tuple[int, int] | None:
        return None  # the simulator has no device memory of its own

    def compute_capability(self) -> tuple[int, int]:
        return tuple(self.cuda.get_current_device().compute_capability)

    def sm_count(self) -> int:
        return 1

    def device_bytes(self, nbytes: int):
        return self.cuda.device_array(max(1, nbytes), dtype=np.uint8)

    def to_device(self, host: np.ndarray):
        return self.cuda.to_device(host)

    def pin_method(self) -> str:
        return "simulator"

    def pinned_bytes(self, nbytes: int) -> np.ndarray:
        """Page-aligned bytes (the simulator's pinned memory is a numpy array)."""
        owner = self.cuda.pinned_array(nbytes + ALIGN, dtype=np.uint8)
        base = (-owner.ctypes.data) % ALIGN
        return owner[base:base + nbytes]

    def stream(self):
        return self.cuda.stream()

    def event(self):
        return self.cuda.event()

    def pointer(self, arr) -> int:
        raise RuntimeError("raw device pointers do not exist under the CUDA simulator")

    def stage(self, buf: np.ndarray, copies, stream) -> int:
        if any(hasattr(c[0], "pieces") for c in copies):  # a module's own tensors (`reload.ModuleArena`)
            copies = split_copies(copies)
        moved = 0
        for dst, off, slot_off, n, rows, pitch in copies:
            if rows == 1:
                src = buf[slot_off:slot_off + n]
            else:  # the 2-D copy: the same rows, gathered on the host
                src = np.ascontiguousarray(rows_view(buf, slot_off, pitch, n, rows)).reshape(-1)
            dst[off:off + n * rows].copy_to_device(src, stream=stream)
            moved += n * rows
        return moved



_devices: dict = {}
_in_force: contextvars.ContextVar = contextvars.ContextVar("planc_device", default=None)


def default_device() -> Device:
    """This process's device: the simulator's or the driver's, chosen here and only here."""
    sim = choice.simulated()
    dev = _devices.get(sim)
    if dev is None:
        dev = _devices[sim] = Simulator() if sim else Gpu()
    return dev


def device() -> Device:
    """The device in force: the one a load put in force (`using`) for its thread and the threads it
    starts with its context, else the process's (`default_device`)."""
    return _in_force.get() or default_device()


@contextlib.contextmanager
def using(dev: Device):
    """Put `dev` in force for this thread (and the threads started with a copy of its context)."""
    token = _in_force.set(dev)
    try:
        yield dev
    finally:
        _in_force.reset(token)


def pinned_ring(dev: Device, nbytes: int):
    """A pinned uint8 buffer of `nbytes` on `dev` whose start is 4 KiB aligned (O_DIRECT), and its owner."""
    owner = dev.pinned_bytes(nbytes)  # page aligned on both devices (registered: mapped pages)
    if owner.ctypes.data % ALIGN:  # cuMemHostAlloc promises less than a page: padded where it gives less
        owner = None
        owner = dev.pinned_bytes(nbytes + ALIGN)
    base = (-owner.ctypes.data) % ALIGN
    return owner, owner[base:base + nbytes]


def rows_view(buf, offset: int, pitch: int, width: int, rows: int):
    """The `rows` x `width` bytes at `offset` of host array `buf`, rows `pitch` apart, as a 2-D view
    (what a 2-D copy reads; the simulator copies it through this)."""
    return np.lib.stride_tricks.as_strided(buf[offset:], (rows, width), (pitch, 1), writeable=False)


# The calls the rest of the package makes, on this process's device.

def index_of(device_name: str) -> int:
    """'cuda:N' -> N; 'cuda' -> 0."""
    return int(device_name.split(":", 1)[1]) if ":" in device_name else 0


def select(device_name: str) -> int:
    """'cuda:N' or 'cuda' -> select that device for this thread; returns N."""
    idx = index_of(device_name)
    device().select(idx)
    return idx


def current_device() -> int:
    """The id of this thread's current device (a thread that selected none: the device the process
    selected last, device 0 before any selection)."""
    return device().current_device()


def capacity(device_name: str) -> tuple[int | None, str]:
    """(bytes, how it was found) of `device_name`'s memory on this host, for `budget.device: auto`.

    Asked of the CUDA driver through ctypes (`driver.total_memory`: no context, no numba); (None,
    why) under the simulator, without a driver, or when this host has no such device: the device
    budget is then not checked at compile (the executor still checks free device memory)."""
    if choice.simulated():
        return None, f"auto: {device_name} is simulated (NUMBA_ENABLE_CUDASIM=1), its capacity is unknown"
    try:
        from . import driver

        n = driver.device_count()
        idx = index_of(device_name)
        if idx >= n:
            return None, f"auto: this host has no {device_name} ({n} CUDA device(s))"
        return driver.total_memory(idx), f"auto: {device_name} capacity from the CUDA driver"
    except Exception as e:  # noqa: BLE001 - no driver, a driver error: the budget stays unchecked, said why
        return None, f"auto: no CUDA driver on this host ({str(e)[:120]})"


def memory_info() -> tuple[int, int] | None:
    """(free, total) device bytes, or None under the simulator (which has no real device memory)."""
    return device().memory_info()


def prewarm(device_name: str | None = None):
    """Start the CUDA driver (and, when the device is known, its primary context) on a thread of its
    own, so that it overlaps what the caller does next (imports, reading the plan); the first real
    call waits for it. Nothing under the simulator. Errors are left for that real call to raise.
    Returns the thread, or None."""
    return device().prewarm(None if device_name is None else index_of(device_name))


def warm_up() -> None:
    """Attach to the current device's context (its host memory is the baseline a report measures against)."""
    dev = device()
    dev.select(dev.current_device())


def device_pointer(arr) -> int:
    return device().pointer(arr)


def release(full: bool = True, settle: bool = True) -> None:
    """Give back what only a garbage collection frees: both implementations free device and pinned
    memory when its owner goes, so only cycles wait (`full`: every generation, after a failure, whose
    traceback frames hold buffers in cycles; else the young ones). `settle`: also wait until the
    rings handed to `release_later` are unpinned."""
    gc.collect() if full else gc.collect(1)
    if settle:
        settle_released()


_unpinning: list = []  # threads unpinning the rings of finished loads
_unpin_lock = threading.Lock()
_unpin_at_exit = []  # [True] once settle_released is registered to run at the interpreter's exit


def release_later(held: list) -> None:
    """Unpin what `held` holds (a finished load's pinned ring: tens of milliseconds per 256 MiB) on a
    thread of its own, off the caller's path; `held` is emptied there, so the caller must keep no
    other reference. Every load waits for it before it measures its baseline (`settle_released`),
    so two rings never coexist, and so does the interpreter's exit."""
    t = threading.Thread(target=held.clear, name="planc-unpin", daemon=True)
    with _unpin_lock:
        if not _unpin_at_exit:
            import atexit

            atexit.register(settle_released)
            _unpin_at_exit.append(True)
        _unpinning.append(t)
    t.start()


def settle_released() -> None:
    """Wait until every ring handed to `release_later` is unpinned."""
    while True:
        with _unpin_lock:
            if not _unpinning:
                return
            t = _unpinning[0]
        t.join()  # joined before it leaves the list: a second caller waits for it too
        with _unpin_lock:
            if _unpinning and _unpinning[0] is t:
                _unpinning.pop(0)


def unpinning() -> list:
    """The threads still unpinning finished loads' rings."""
    with _unpin_lock:
        return list(_unpinning)


def leave_released_to_exit() -> None:
    """For a process that leaves through `os._exit`: the exit gives the rings back at once, so the
    interpreter's exit need not wait for them (the wait is registered again by the next ring)."""
    import atexit

    with _unpin_lock:
        if _unpin_at_exit:
            atexit.unregister(settle_released)
            _unpin_at_exit.clear()


def split_copies(copies) -> list:
    """`Device.stage`'s copies with those into a `reload.ModuleArena` (a destination with `pieces`) split
    at its tensors' boundaries."""
    out = []
    for dst, off, slot_off, n, rows, pitch in copies:
        if hasattr(dst, "pieces"):
            out += [(d, o, slot_off + s, k, 1, 0) for d, o, s, k in dst.pieces(off, n)]
        else:
            out.append((dst, off, slot_off, n, rows, pitch))
    return out
