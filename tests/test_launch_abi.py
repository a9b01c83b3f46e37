"""The driver-launch path's argument packing (numba's kernel ABI) and signature matching.

The launches themselves need a GPU (tests/test_execute_gpu.py); what is checked here is the
layout each argument takes, against numba's own types.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core import types as nt  # noqa: E402

from planc.execute.device import launch  # noqa: E402


class DeviceLike:
    """The attributes of a numba device array that the packing reads."""

    def __init__(self, shape, dtype, ptr):
        self._a = np.empty(shape, dtype)
        self.shape, self.strides, self.size, self.ndim = self._a.shape, self._a.strides, self._a.size, self._a.ndim
        self.dtype = self._a.dtype
        self.device_ctypes_pointer = type("P", (), {"value": ptr})()

    def is_c_contiguous(self):
        return self._a.flags.c_contiguous


def test_arrays_pack_as_meminfo_parent_nitems_itemsize_data_shape_strides():
    a = DeviceLike((5,), np.uint16, 0x7F0000001000)
    t = DeviceLike((3, 3), np.int64, 0x7F0000002000)
    assert launch.pack([a, t, 7, np.int64(-1)]) == [
        0, 0, 5, 2, 0x7F0000001000, 5, 2,
        0, 0, 9, 8, 0x7F0000002000, 3, 3, 24, 8,
        7, -1]


def test_signature_and_numba_types_agree():
    a = DeviceLike((5,), np.uint16, 1)
    f = DeviceLike((4,), np.float32, 2)
    sig = launch.signature([a, f, 3])
    assert sig == (("a", "<u2", 1), ("a", "<f4", 1), ("i",))
    assert launch._matches((nt.Array(nt.uint16, 1, "C"), nt.Array(nt.float32, 1, "C"), nt.int64), sig)
    assert not launch._matches((nt.Array(nt.uint16, 1, "A"), nt.Array(nt.float32, 1, "C"), nt.int64), sig)
    assert not launch._matches((nt.Array(nt.uint32, 1, "C"), nt.Array(nt.float32, 1, "C"), nt.int64), sig)
    assert not launch._matches((nt.Array(nt.uint16, 1, "C"), nt.Array(nt.float32, 1, "C"), nt.int32), sig)
    assert not launch._matches((nt.Array(nt.uint16, 1, "C"),), sig)


@pytest.mark.parametrize("arg", [True, 1.5, np.zeros(3), object()])
def test_anything_else_goes_through_numba(arg):
    assert launch.signature([arg]) is None


def test_non_contiguous_arrays_go_through_numba():
    a = DeviceLike((4, 4), np.uint8, 1)
    a.is_c_contiguous = lambda: False
    assert launch.signature([a]) is None


def test_grid_dims():
    assert launch._dims(7) == (7, 1, 1)
    assert launch._dims((2, 3)) == (2, 3, 1)
    assert launch._dims([2, 3, 4]) == (2, 3, 4)


def test_disabled_under_the_simulator():
    from planc.execute.device import seam

    assert not launch.enabled(seam.device())


def test_a_thread_s_argument_buffer_is_refilled_for_each_launch():
    """The launch's 8-byte values go into one buffer per thread and count, pointed at by the array
    cuLaunchKernel takes; a negative value is its two's complement, as numba's ABI lays it out."""
    import ctypes
    import threading

    from planc.execute.device.launch import _params

    buf, params = _params(3)
    buf[:] = [1, -1, 7]
    assert _params(3) == (buf, params) and list(buf) == [1, 2**64 - 1, 7]
    assert [params[i] for i in range(3)] == [ctypes.addressof(buf) + 8 * i for i in range(3)]
    assert _params(4)[0] is not buf
    other = []
    t = threading.Thread(target=lambda: other.append(_params(3)[0]))
    t.start()
    t.join()
    assert other[0] is not buf  # a thread of its own: a launch never refills another thread's arguments
