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
