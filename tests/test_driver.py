"""The driver seam's host-side logic, checked without a GPU.

`driver.DeviceArray` is what a GPU load hands to the kernels' launch ABI, to `--verify` and to
PyTorch (`__cuda_array_interface__`): its slices, views and reshapes are pointer arithmetic, held
here to numpy's own arithmetic on a host array of the same bytes (same offsets, shapes, strides,
type strings). No driver call is made by any of them. Also: a machine without libcuda gets a typed
error that says what to do, and the device implementation is chosen as numba chooses it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planc.execute import driver, launch

BASE = 0x7F00_0000_0000


class _Memory:
    """Stands for a `DeviceMemory` (its owner): a view only holds it, and reads its `ctx` to copy."""

    ptr, nbytes, ctx = BASE, 1 << 20, 0


def _pair(nbytes: int):
    host = np.zeros(nbytes, np.uint8)
    dev = driver.DeviceArray(_Memory(), BASE, (nbytes,), np.uint8)
    return host, dev


def _same(host: np.ndarray, dev: driver.DeviceArray, host_base: int) -> None:
    iface = dev.__cuda_array_interface__
    assert dev.shape == host.shape and iface["shape"] == host.shape
    assert dev.dtype == host.dtype and iface["typestr"] == host.dtype.str
    assert dev.strides == host.strides and dev.size == host.size and dev.nbytes == host.nbytes
    if not host.size:  # an empty array's address means nothing, and is exported as 0
        assert iface["data"] == (0, False)
        return
    offset = host.__array_interface__["data"][0] - host_base
    assert dev.ptr == BASE + offset and iface["data"] == (BASE + offset, False)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096), st.integers(-5000, 5000), st.integers(-5000, 5000),
       st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64, np.float32]))
def test_slices_and_views_match_numpy(nbytes, lo, hi, dtype):
    host, dev = _pair(nbytes)
    base = host.__array_interface__["data"][0]
    h, d = host[lo:hi], dev[lo:hi]
    _same(h, d, base)
    item = np.dtype(dtype).itemsize
    if h.nbytes % item == 0:
        _same(h.view(dtype), d.view(dtype), base)
        _same(h.view(dtype)[1:-1], d.view(dtype)[1:-1], base)  # slices count elements, not bytes
        n = h.nbytes // item
        if n and n % 2 == 0:
            _same(h.view(dtype).reshape(2, n // 2), d.view(dtype).reshape((2, n // 2)), base)
    else:
        with pytest.raises(ValueError):
            d.view(dtype)


def test_what_is_refused():
    _, dev = _pair(64)
    with pytest.raises(TypeError):
        dev[::2]
    with pytest.raises(TypeError):
        dev[3]
    with pytest.raises(ValueError):
        dev.reshape((7, 9))
    with pytest.raises(TypeError):
        dev.view(np.uint16).reshape((4, 8))[1:2]  # a 2-D array is not sliced


def test_device_arrays_pack_in_the_kernel_abi():
    """The launch ABI reads a DeviceArray as it reads a numba device array (tests/test_launch_abi.py)."""
    _, dev = _pair(64)
    a, t = dev[16:26].view(np.uint16), dev[:72 - 8].view(np.int64).reshape((4, 2))
    assert launch.signature([a, t, 3]) == (("a", "<u2", 1), ("a", "<i8", 2), ("i",))
    assert launch.pack([a, t, 3]) == [0, 0, 5, 2, BASE + 16, 5, 2, 0, 0, 8, 8, BASE, 4, 2, 16, 8, 3]


def test_a_machine_without_the_driver_gets_a_typed_error():
    """No libcuda: the first driver call says so and what to do, as an ExecuteError (code cuda)."""
    probe = """
import ctypes, sys
try:
    ctypes.CDLL("libcuda.so.1")
    print("has-driver")
    sys.exit(0)
except OSError:
    pass
from planc.errors import ExecuteError
from planc.execute import driver
try:
    driver.lib()
except ExecuteError as e:
    print(e.code, "|", e)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "has-driver":
        pytest.skip("this machine has a CUDA driver")
    code, _, msg = out.stdout.partition(" | ")
    assert code == "cuda" and "libcuda.so.1" in msg and "NUMBA_ENABLE_CUDASIM=1" in msg


@pytest.mark.parametrize("value, sim", [("1", True), ("0", False), ("", False), ("yes", False), (None, False)])
def test_the_device_is_chosen_as_numba_chooses_before_numba_is_imported(value, sim):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if value is not None:
        env["NUMBA_ENABLE_CUDASIM"] = value
    probe = ("import sys; from planc.execute import seam; "
             "print(seam.simulated(), type(seam.device()).__name__ if seam.simulated() else 'Gpu', 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    got_sim, kind, numba_loaded = out.stdout.split()
    assert got_sim == str(sim) and kind == ("Simulator" if sim else "Gpu")
    assert numba_loaded == str(sim)  # the simulator is numba's; the GPU path never imports it
