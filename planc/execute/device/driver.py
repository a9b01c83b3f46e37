"""The CUDA driver, reached through ctypes: the executor's device on a real GPU.

Everything a load does on a GPU goes through here: the primary context of the load's device (the
one the CUDA runtime, and so PyTorch, uses too: a process that already set it up pays nothing to
attach), device and pinned allocations, a stream, events, copies, module loads and launches.
Importing this module imports neither numba nor anything else that a load does not need; numba is
imported only when a kernel launch has no machine code shipped with the package (`launch.py`).

Memory is freed when its owner is: `DeviceMemory.free()` (or the last reference going) calls
`cuMemFree` at once, so nothing waits in a deferred-free queue. Every call that can fail raises a
typed `ExecuteError` (code `cuda`) with the driver's own error text.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

from .libc import MAP_FAILED, libc
from ...base import settings
from ...base.codes import Code

if TYPE_CHECKING:  # numpy is imported where arrays are made: `planc run` starts the driver before it
    import numpy as np

_lib = None
_lock = threading.RLock()  # primary_context() may start the driver (lib()) while it holds it
_contexts: dict[int, int] = {}  # device ordinal -> its retained primary context

_P = ctypes.POINTER
_vp, _u64, _sz, _int, _uint = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint

# name -> argument types; every function returns a CUresult (int).
_SIGNATURES = {
    "cuInit": [_uint],
    "cuGetErrorString": [_int, _P(ctypes.c_char_p)],
    "cuDeviceGet": [_P(_int), _int],
    "cuDeviceGetCount": [_P(_int)],
    "cuDeviceGetAttribute": [_P(_int), _int, _int],
    "cuDeviceTotalMem_v2": [_P(_sz), _int],
    "cuDevicePrimaryCtxRetain": [_P(_vp), _int],
    "cuCtxSetCurrent": [_vp],
    "cuCtxGetCurrent": [_P(_vp)],
    "cuCtxGetDevice": [_P(_int)],
    "cuCtxPushCurrent_v2": [_vp],
    "cuCtxPopCurrent_v2": [_P(_vp)],
    "cuMemGetInfo_v2": [_P(_sz), _P(_sz)],
    "cuMemAlloc_v2": [_P(_u64), _sz],
    "cuMemFree_v2": [_u64],
    "cuMemHostAlloc": [_P(_vp), _sz, _uint],
    "cuMemFreeHost": [_vp],
    "cuMemHostRegister_v2": [_vp, _sz, _uint],
    "cuMemHostUnregister": [_vp],
    "cuStreamCreate": [_P(_vp), _uint],
    "cuStreamDestroy_v2": [_vp],
    "cuStreamSynchronize": [_vp],
    "cuEventCreate": [_P(_vp), _uint],
    "cuEventDestroy_v2": [_vp],
    "cuEventRecord": [_vp, _vp],
    "cuEventSynchronize": [_vp],
    "cuStreamWaitEvent": [_vp, _vp, _uint],
    "cuMemcpyHtoDAsync_v2": [_u64, _vp, _sz, _vp],
    "cuMemcpyHtoD_v2": [_u64, _vp, _sz],
    "cuMemcpyDtoH_v2": [_vp, _u64, _sz],
    "cuMemcpy2DAsync_v2": [_vp, _vp],
    "cuModuleLoadData": [_P(_vp), ctypes.c_char_p],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuLaunchKernel": [_vp, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _vp, _vp, _vp],
}

CU_EVENT_DISABLE_TIMING = 2
ATTR_SM_COUNT, ATTR_CC_MAJOR, ATTR_CC_MINOR = 16, 75, 76
_HOST, _DEVICE = 1, 2  # CUmemorytype


def lib():
    """libcuda with every function the executor calls bound and typed; cuInit done once."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                try:
                    cu = ctypes.CDLL("libcuda.so.1")
                except OSError as e:
                    from ...base.errors import ExecuteError

                    raise ExecuteError(f"no CUDA driver (libcuda.so.1: {e}); run on a machine with an NVIDIA "
                                       "GPU, or set NUMBA_ENABLE_CUDASIM=1 for the simulator", code=Code.CUDA) from None
                for name, args in _SIGNATURES.items():
                    fn = getattr(cu, name)
                    fn.argtypes, fn.restype = args, ctypes.c_int
                check(cu.cuInit(0), "cuInit", cu)
                _lib = cu
    return _lib


# The functions that only queue work on a stream (or read the thread's context): called holding the
# interpreter's lock unless the load's settings say `release` (`issue_lib`).
_ISSUE = ("cuMemcpyHtoDAsync_v2", "cuMemcpy2DAsync_v2", "cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel",
          "cuCtxGetCurrent")
_held = None


def issue_lib():
    """libcuda's issue path as the load's settings call it (`settings.issue_gil`): `hold` (default),
    the functions of `_ISSUE` bound through `ctypes.PyDLL`, which keeps the interpreter's lock through
    the call; `release`, `lib()`'s, which lets it go. Each of those calls returns in microseconds; one
    that lets the lock go waits afterwards to take it back from whichever reader thread took it, and
    a load's thread makes four or more such calls per slot (a copy, an event, launches)."""
    global _held
    cu = lib()
    if settings.issue_gil() == "release":
        return cu
    if _held is None:
        with _lock:
            if _held is None:
                held = ctypes.PyDLL(cu._name)
                for name in _ISSUE:
                    fn = getattr(held, name)
                    fn.argtypes, fn.restype = _SIGNATURES[name], ctypes.c_int
                _held = held
    return _held


def error_text(rc: int, cu=None) -> str:
    msg = ctypes.c_char_p()
    (cu or lib()).cuGetErrorString(rc, ctypes.byref(msg))
    return msg.value.decode() if msg.value else f"CUresult {rc}"


def check(rc: int, what: str, cu=None) -> None:
    if rc:
        from ...base.errors import ExecuteError

        raise ExecuteError(f"{what} failed: {error_text(rc, cu)}", code=Code.CUDA)


# -- context ------------------------------------------------------------------------------------

def device_count() -> int:
    n = _int()
    check(lib().cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return n.value


def primary_context(idx: int) -> int:
    """The retained primary context of device `idx` (retained once per process, never released:
    the runtime shares it, and the driver drops it at exit)."""
    ctx = _contexts.get(idx)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(idx)
            if ctx is None:
                cu = lib()
                n = device_count()
                if not 0 <= idx < n:
                    from ...base.errors import ExecuteError

                    raise ExecuteError(f"device cuda:{idx} does not exist: this machine has {n} CUDA device(s)",
                                       code=Code.NO_DEVICE)
                dev, h = _int(), _vp()
                check(cu.cuDeviceGet(ctypes.byref(dev), idx), "cuDeviceGet")
                check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(h), dev), "cuDevicePrimaryCtxRetain")
                ctx = _contexts[idx] = int(h.value)
    return ctx


def prewarm(idx: int | None = None) -> threading.Thread:
    """Start the driver (cuInit) and, when `idx` is given, that device's primary context, on a
    thread of its own: the first real call waits for it (the lock) and finds them made. Errors are
    left for that real call to raise. Needs nothing but ctypes (no numpy), so that a command can
    start it before its own imports."""

    def start():
        try:
            lib()
            if idx is not None:
                primary_context(idx)
        except Exception:  # noqa: BLE001 - the load's own call reports it
            pass

    t = threading.Thread(target=start, name="planc-driver", daemon=True)
    t.start()
    _starting.append(t)
    return t


_starting: list = []  # the threads `prewarm` started


def wait_started(timeout: float = 10.0) -> None:
    """Wait for the threads `prewarm` started: a process must not leave while one is inside the driver."""
    for t in list(_starting):
        t.join(timeout)


_selected = [0]  # the device this process selected last: a thread that selected none works on it


def make_current(idx: int) -> None:
    """Make device `idx`'s primary context this thread's current context."""
    check(lib().cuCtxSetCurrent(primary_context(idx)), "cuCtxSetCurrent")
    _selected[0] = idx


def ensure_context(cu=None) -> int:
    """This thread's current context; a thread that has none gets the primary context of the device
    the process selected last (device 0 before any selection). The runtime API would give such a
    thread device 0; here a helper thread of a load on cuda:1 works on cuda:1 without being told.
    `cu`: the driver library to ask (None: libcuda, `lib()`; a test passes a stand-in)."""
    ctx = current_context(cu)
    if not ctx:
        ctx = primary_context(_selected[0])
        check(lib().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def current_context(cu=None) -> int:
    h = _vp()
    check((cu or issue_lib()).cuCtxGetCurrent(ctypes.byref(h)), "cuCtxGetCurrent", cu)
    return int(h.value or 0)


def current_device() -> int:
    """The ordinal of this thread's current context's device (with none current: the device selected last)."""
    if not current_context():
        return _selected[0]
    d = _int()
    check(lib().cuCtxGetDevice(ctypes.byref(d)), "cuCtxGetDevice")
    return d.value


def attribute(attr: int, idx: int) -> int:
    v = _int()
    check(lib().cuDeviceGetAttribute(ctypes.byref(v), attr, idx), "cuDeviceGetAttribute")
    return v.value


def total_memory(idx: int) -> int:
    """Device `idx`'s memory in bytes (cuDeviceTotalMem: no context is made, so compile can ask)."""
    dev, total = _int(), _sz()
    check(lib().cuDeviceGet(ctypes.byref(dev), idx), "cuDeviceGet")
    check(lib().cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem")
    return int(total.value)


def memory_info() -> tuple[int, int]:
    ensure_context()
    free, total = _sz(), _sz()
    check(lib().cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return int(free.value), int(total.value)


class _Current:
    """Within: `ctx` is this thread's current context (pushed only when it is not already)."""

    def __init__(self, ctx: int, cu=None):
        self.ctx, self.pushed, self.cu = ctx, False, cu

    def __enter__(self):
        if current_context(self.cu) != self.ctx:
            check(lib().cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc):
        if self.pushed:
            lib().cuCtxPopCurrent_v2(ctypes.byref(_vp()))


# -- device memory ------------------------------------------------------------------------------

class _Owned:
    """Memory the driver handed out at `self.ptr`, in context `self.ctx`: `free()` gives it back once,
    in that context, and so does the last reference going (`_give_back(ptr)` says how)."""

    __slots__ = ()
    cu = None  # the driver library it came from (None: libcuda, `lib()`; a test's stand-in otherwise)

    def _give_back(self, ptr: int) -> None:
        raise NotImplementedError

    def _lib(self):
        return _lib if self.cu is None else self.cu

    def free(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr and self._lib() is not None:
            with _Current(self.ctx, self.cu):
                self._give_back(ptr)

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone already
            pass


class DeviceMemory(_Owned):
    """One `cuMemAlloc` of the current context; freed by `free()` or when the last reference goes."""

    __slots__ = ("ptr", "nbytes", "ctx", "__weakref__")

    def __init__(self, nbytes: int):
        self.ptr, self.nbytes, self.ctx = 0, int(nbytes), ensure_context()
        p = _u64()
        rc = lib().cuMemAlloc_v2(ctypes.byref(p), max(1, self.nbytes))
        if rc:
            from ...base.errors import ExecuteError

            raise ExecuteError(f"cuMemAlloc of {self.nbytes:,} bytes failed: {error_text(rc)}", code=Code.CUDA)
        self.ptr = int(p.value)

    def _give_back(self, ptr: int) -> None:
        _lib.cuMemFree_v2(ptr)


class DeviceArray:
    """A C-contiguous, typed view of device memory: what the executor, the kernels' launch ABI and
    `__cuda_array_interface__` consumers (PyTorch, CuPy, numba) need of a device array."""

    __slots__ = ("mem", "ptr", "shape", "dtype", "__weakref__")

    def __init__(self, mem: DeviceMemory, ptr: int, shape: tuple, dtype):
        import numpy as np

        self.mem, self.ptr, self.shape, self.dtype = mem, ptr, tuple(int(s) for s in shape), np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple:
        out, step = [], self.dtype.itemsize
        for s in reversed(self.shape):
            out.append(step)
            step *= s
        return tuple(reversed(out))

    def __len__(self) -> int:
        return self.shape[0]

    def is_c_contiguous(self) -> bool:
        return True

    @property
    def device_ctypes_pointer(self):
        return ctypes.c_void_p(self.ptr)

    def __getitem__(self, key):
        if not isinstance(key, slice) or self.ndim != 1:
            raise TypeError("a device array is sliced along one dimension, with a step of 1")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise TypeError("a device array is sliced with a step of 1")
        n = max(0, stop - start)
        return DeviceArray(self.mem, self.ptr + start * self.dtype.itemsize, (n,), self.dtype)

    def view(self, dtype) -> "DeviceArray":
        import numpy as np

        d = np.dtype(dtype)
        if self.ndim != 1 or self.nbytes % d.itemsize:
            raise ValueError(f"cannot view {self.nbytes} bytes of shape {self.shape} as {d}")
        return DeviceArray(self.mem, self.ptr, (self.nbytes // d.itemsize,), d)

    def reshape(self, shape) -> "DeviceArray":
        shape = tuple(shape)
        n = 1
        for s in shape:
            n *= s
        if n != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return DeviceArray(self.mem, self.ptr, shape, self.dtype)

    def copy_to_host(self) -> np.ndarray:
        import numpy as np

        out = np.empty(self.shape, dtype=self.dtype)
        if out.nbytes:
            with _Current(self.mem.ctx):
                check(lib().cuMemcpyDtoH_v2(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr if self.size else 0, False),
                "version": 3, "strides": None, "stream": None}

    def __repr__(self) -> str:
        return f"DeviceArray(0x{self.ptr:x}, {self.shape}, {self.dtype})"


def device_bytes(nbytes: int) -> DeviceArray:
    mem = DeviceMemory(nbytes)
    return DeviceArray(mem, mem.ptr, (int(nbytes),), "uint8")


def to_device(host: np.ndarray) -> DeviceArray:
    """A device copy of a host array (synchronous)."""
    import numpy as np

    host = np.ascontiguousarray(host)
    mem = DeviceMemory(host.nbytes)
    if host.nbytes:  # DeviceMemory made a context current
        check(lib().cuMemcpyHtoD_v2(mem.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
    return DeviceArray(mem, mem.ptr, host.shape, host.dtype)


# -- pinned host memory ---------------------------------------------------------------------------

class PinnedMemory(_Owned):
    """One `cuMemHostAlloc` (page-locked, mapped into every context); numpy arrays made from it
    (`np.asarray`) hold it, and it is freed when the last of them goes."""

    def __init__(self, nbytes: int, cu=None):
        self.cu = cu
        self.ptr, self.nbytes, self.ctx = 0, int(nbytes), ensure_context(cu)
        p = _vp()
        rc = (cu or lib()).cuMemHostAlloc(ctypes.byref(p), max(1, self.nbytes), 0)
        if rc:
            from ...base.errors import ExecuteError

            raise ExecuteError(f"cuMemHostAlloc of {self.nbytes:,} pinned bytes failed: {error_text(rc, cu)}",
                               code=Code.CUDA)
        self.ptr = int(p.value)
        self.__array_interface__ = {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                    "version": 3}

    def _give_back(self, ptr: int) -> None:
        self._lib().cuMemFreeHost(ptr)


class RegisteredMemory(_Owned):
    """Page-locked host memory made from an anonymous mapping: transparent huge pages where the
    mapping holds whole 2 MiB pages, populated, then registered with `cuMemHostRegister`. Pinning it
    costs about a third of a `cuMemHostAlloc` of the same size (the kernel zeroes and maps 512 times
    fewer pages). The start is page aligned. Freed (unregistered, unmapped) when the last numpy
    array made from it goes, like `PinnedMemory`.

    Raises ExecuteError: `pin-refused` when the driver refuses to register host memory (some VMs and
    drivers; the caller may fall back to `cuMemHostAlloc`), `host-memory` when the memory itself
    cannot be had (mapping, populating, or the driver out of memory). Nothing is left mapped."""

    def __init__(self, nbytes: int, cu=None):
        from ...base.errors import ExecuteError

        self.cu = cu
        self.ptr, self.base, self.nbytes, self.ctx = 0, 0, int(nbytes), ensure_context(cu)
        self.mapped = -(-max(1, self.nbytes) // _PAGE) * _PAGE
        self.base, self.length = _map_anonymous(self.mapped)
        try:
            ptr = self._trim()
            if self.mapped >= _HUGE:
                libc().madvise(_vp(ptr), _sz(self.mapped // _HUGE * _HUGE), _MADV_HUGEPAGE)
            _populate(ptr, self.mapped)
            rc = (cu or lib()).cuMemHostRegister_v2(_vp(ptr), self.mapped, 0)
            if rc:
                raise ExecuteError(f"cuMemHostRegister of {self.nbytes:,} host bytes failed: {error_text(rc, cu)}",
                                   code=Code.HOST_MEMORY if rc == _OUT_OF_MEMORY else Code.PIN_REFUSED)
        except BaseException:
            self._unmap()
            raise
        self.ptr = ptr  # only now: free() unregisters exactly what was registered
        self.__array_interface__ = {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                    "version": 3}

    def _trim(self) -> int:
        """Keep only the `mapped` bytes from a 2 MiB boundary (from 2 MiB up): the padding is unmapped,
        so that no huge page can form over bytes the plan did not count (THP `always`)."""
        if self.length == self.mapped:
            return self.base
        c, base, length = libc(), self.base, self.length
        ptr = base + (-base) % _HUGE
        end = ptr + self.mapped
        if ptr > base:
            c.munmap(_vp(base), _sz(ptr - base))
        if base + length > end:
            c.munmap(_vp(end), _sz(base + length - end))
        self.base, self.length = ptr, self.mapped
        return ptr

    def _unmap(self) -> None:
        base, self.base = self.base, 0
        if base:
            libc().munmap(_vp(base), _sz(self.length))

    def _give_back(self, ptr: int) -> None:
        self._lib().cuMemHostUnregister(_vp(ptr))

    def free(self) -> None:
        try:
            super().free()
        finally:
            self._unmap()  # the mapping goes even where the driver could not be reached


def _populate(ptr: int, nbytes: int) -> None:
    """Make the pages now, in the kernel (MADV_POPULATE_WRITE, Linux 5.14: no page faults, and without
    the interpreter's lock, so the ring's lanes pin in parallel). An older kernel refuses the advice
    (EINVAL), and one write per small page faults them in instead; any other refusal (ENOMEM under a
    memory limit) is a typed error rather than faults that would end in the OOM killer."""
    if libc().madvise(_vp(ptr), _sz(nbytes), _MADV_POPULATE_WRITE) == 0:
        return
    import errno
    import os

    err = ctypes.get_errno()
    if err not in (errno.EINVAL, 0):
        from ...base.errors import ExecuteError

        raise ExecuteError(f"making {nbytes:,} bytes of host memory for the pinned ring failed: "
                           f"{os.strerror(err)}", code=Code.HOST_MEMORY)
    import numpy as np

    np.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), np.uint8)[::_PAGE] = 0


_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY
_PAGE, _HUGE = 4096, 2 << 20
_MADV_HUGEPAGE, _MADV_POPULATE_WRITE = 14, 23
def _map_anonymous(nbytes: int) -> tuple[int, int]:
    """(address, length) of a private anonymous read-write mapping of at least `nbytes`; from 2 MiB
    up, 2 MiB more, so that a huge-page-aligned run of `nbytes` lies inside it."""
    import mmap as _m

    length = nbytes + (_HUGE if nbytes >= _HUGE else 0)
    c = libc()
    p = c.mmap(None, length, _m.PROT_READ | _m.PROT_WRITE, _m.MAP_PRIVATE | _m.MAP_ANONYMOUS, -1, 0)
    if p is None or p == MAP_FAILED:
        import os

        from ...base.errors import ExecuteError

        raise ExecuteError(f"mmap of {length:,} host bytes failed: {os.strerror(ctypes.get_errno())}", code=Code.HOST_MEMORY)
    return int(p), length


def pinned_array(nbytes: int, how: str = "register", cu=None) -> np.ndarray:
    """`nbytes` of page-locked host memory as a uint8 array: `register` (huge pages registered with
    the driver, the default) or `alloc` (`cuMemHostAlloc`); `cu` as for `ensure_context`."""
    import numpy as np

    return np.asarray(RegisteredMemory(nbytes, cu) if how == "register" else PinnedMemory(nbytes, cu))


# -- streams and events ---------------------------------------------------------------------------

class Stream:
    """A CUDA stream of the current context; `handle` is the CUstream as an int."""

    def __init__(self):
        h = _vp()
        self.ctx = ensure_context()
        check(lib().cuStreamCreate(ctypes.byref(h), 0), "cuStreamCreate")
        self.handle = int(h.value)

    def synchronize(self) -> None:
        check(lib().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def __del__(self):
        h, self.handle = getattr(self, "handle", 0), 0
        if h and _lib is not None:
            try:
                with _Current(self.ctx):
                    _lib.cuStreamDestroy_v2(h)
            except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone already
                pass


class Event:
    """A CUDA event without timing: recorded after a slot's copies, waited on before its reuse."""

    def __init__(self):
        h = _vp()
        self.ctx = ensure_context()
        check(lib().cuEventCreate(ctypes.byref(h), CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self.handle = int(h.value)

    def record(self, stream: Stream) -> None:
        check(issue_lib().cuEventRecord(self.handle, stream.handle), "cuEventRecord")

    def synchronize(self) -> None:
        check(lib().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def wait(self, stream: Stream) -> None:
        """Work issued to `stream` from now on starts after this event (numba's `Event.wait`)."""
        check(issue_lib().cuStreamWaitEvent(stream.handle, self.handle, 0), "cuStreamWaitEvent")

    def __del__(self):
        h, self.handle = getattr(self, "handle", 0), 0
        if h and _lib is not None:
            try:
                with _Current(self.ctx):
                    _lib.cuEventDestroy_v2(h)
            except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone already
                pass


# -- copies ---------------------------------------------------------------------------------------

def copy_h2d(dst_ptr: int, src_ptr: int, nbytes: int, stream_h: int) -> None:
    """Async copy of `nbytes` from pinned host memory at `src_ptr` to device memory at `dst_ptr`."""
    rc = issue_lib().cuMemcpyHtoDAsync_v2(dst_ptr, src_ptr, nbytes, stream_h)
    if rc:
        check(rc, "cuMemcpyHtoDAsync")


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D (cuda.h)."""

    _fields_ = [("srcXInBytes", _sz), ("srcY", _sz), ("srcMemoryType", _int), ("srcHost", _vp),
                ("srcDevice", _u64), ("srcArray", _vp), ("srcPitch", _sz),
                ("dstXInBytes", _sz), ("dstY", _sz), ("dstMemoryType", _int), ("dstHost", _vp),
                ("dstDevice", _u64), ("dstArray", _vp), ("dstPitch", _sz),
                ("WidthInBytes", _sz), ("Height", _sz)]


def copy_h2d_2d(dst_ptr: int, src_ptr: int, pitch: int, width: int, rows: int, stream_h: int) -> None:
    """Async 2-D copy: `rows` rows of `width` bytes, `pitch` apart in pinned host memory at
    `src_ptr`, packed at device memory `dst_ptr` (a rank's slice of whole rows held in a slot)."""
    p = _Memcpy2D(srcMemoryType=_HOST, srcHost=src_ptr, srcPitch=pitch, dstMemoryType=_DEVICE,
                  dstDevice=dst_ptr, dstPitch=width, WidthInBytes=width, Height=rows)
    check(issue_lib().cuMemcpy2DAsync_v2(ctypes.byref(p), stream_h), "cuMemcpy2DAsync")
