"""The one seam between the simulator and a real GPU.

Everything the CUDA simulator lacks (raw device pointers, `__cuda_array_interface__`, memory info
that means something, event queries) is reached through here, so that the rest of the executor is
the same code in both places. Importing this module imports numba.cuda.
"""

from __future__ import annotations

from numba import config, cuda  # the numpy.row_stack alias numba-cuda needs is set by planc.execute


def simulated() -> bool:
    return bool(config.ENABLE_CUDASIM)


def select(device: str) -> int:
    """'cuda:N' or 'cuda' -> select that device for this thread; returns N."""
    idx = 0
    if ":" in device:
        idx = int(device.split(":", 1)[1])
    if not simulated():
        cuda.select_device(idx)
    return idx


def current_device() -> int:
    """The id of this thread's current device (a new thread's is device 0 until it selects one)."""
    return int(cuda.get_current_device().id)


def memory_info() -> tuple[int, int] | None:
    """(free, total) device bytes, or None under the simulator (which has no real device memory)."""
    if simulated():
        return None
    free, total = cuda.current_context().get_memory_info()
    return int(free), int(total)


def device_pointer(arr) -> int:
    if simulated():
        raise RuntimeError("raw device pointers do not exist under the CUDA simulator")
    return int(arr.device_ctypes_pointer.value or 0)


def warm_up() -> None:
    """Create the CUDA context (its host memory is the baseline the report measures against)."""
    if not simulated():
        cuda.current_context()


# -- raw driver calls on the hot path ---------------------------------------------------------------
# numba's device-array slicing and `copy_to_device` cost 1-3 ms of Python per call (argument checks,
# a new DeviceNDArray per slice). The copy loop instead calls the driver directly through ctypes with
# pointers computed once per allocation: a few microseconds, and the GIL is released during the call.

_cu = None


def _driver():
    global _cu
    if _cu is None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.cuMemcpyHtoDAsync_v2.restype = ctypes.c_int
        lib.cuMemcpy2DAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cuMemcpy2DAsync_v2.restype = ctypes.c_int
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleLoadData.restype = ctypes.c_int
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuModuleGetFunction.restype = ctypes.c_int
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuCtxGetCurrent.restype = ctypes.c_int
        u = ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernel.restype = ctypes.c_int
        _cu = lib
    return _cu


def stream_handle(stream) -> int:
    """The CUstream of a numba stream, as an int (numba's handle is a cuda.bindings or ctypes object)."""
    h = stream.handle
    v = getattr(h, "value", None)
    return int(v if v is not None else int(h))


def _check(rc: int, what: str) -> None:
    if rc:
        import ctypes

        from ..errors import ExecuteError

        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(msg))
        text = msg.value.decode() if msg.value else f"CUresult {rc}"
        raise ExecuteError(f"{what} failed: {text}", code="cuda")


def copy_h2d(dst_ptr: int, src_ptr: int, nbytes: int, stream_h: int) -> None:
    """Async copy of `nbytes` from pinned host memory at `src_ptr` to device memory at `dst_ptr`."""
    _check(_driver().cuMemcpyHtoDAsync_v2(dst_ptr, src_ptr, nbytes, stream_h), "cuMemcpyHtoDAsync")


_memcpy2d = None


def _memcpy2d_type():
    """ctypes layout of CUDA_MEMCPY2D (cuda.h)."""
    global _memcpy2d
    if _memcpy2d is None:
        import ctypes

        sz, ptr, u64, mt = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int

        class CUDA_MEMCPY2D(ctypes.Structure):
            _fields_ = [("srcXInBytes", sz), ("srcY", sz), ("srcMemoryType", mt), ("srcHost", ptr),
                        ("srcDevice", u64), ("srcArray", ptr), ("srcPitch", sz),
                        ("dstXInBytes", sz), ("dstY", sz), ("dstMemoryType", mt), ("dstHost", ptr),
                        ("dstDevice", u64), ("dstArray", ptr), ("dstPitch", sz),
                        ("WidthInBytes", sz), ("Height", sz)]

        _memcpy2d = CUDA_MEMCPY2D
    return _memcpy2d


_HOST, _DEVICE = 1, 2  # CUmemorytype


def copy_h2d_2d(dst_ptr: int, src_ptr: int, pitch: int, width: int, rows: int, stream_h: int) -> None:
    """Async 2-D copy: `rows` rows of `width` bytes, `pitch` apart in pinned host memory at
    `src_ptr`, packed at device memory `dst_ptr` (a rank's slice of whole rows held in a slot)."""
    import ctypes

    p = _memcpy2d_type()(srcMemoryType=_HOST, srcHost=src_ptr, srcPitch=pitch, dstMemoryType=_DEVICE,
                         dstDevice=dst_ptr, dstPitch=width, WidthInBytes=width, Height=rows)
    _check(_driver().cuMemcpy2DAsync_v2(ctypes.byref(p), stream_h), "cuMemcpy2DAsync")


def rows_view(buf, offset: int, pitch: int, width: int, rows: int):
    """The `rows` x `width` bytes at `offset` of host array `buf`, rows `pitch` apart, as a 2-D view
    (what a 2-D copy reads; the simulator copies it through this)."""
    import numpy as np

    return np.lib.stride_tricks.as_strided(buf[offset:], (rows, width), (pitch, 1), writeable=False)
