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

from planc.execute.device import driver, launch

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
from planc.base.errors import ExecuteError
from planc.execute.device import driver
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
    probe = ("import sys; from planc.execute.device import seam; d = seam.default_device(); "
             "print(d.simulated, type(d).__name__, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    got_sim, kind, numba_loaded = out.stdout.split()
    assert got_sim == str(sim) and kind == ("Simulator" if sim else "Gpu")
    assert numba_loaded == str(sim)  # the simulator is numba's; the GPU path never imports it


# -- registered pinned memory, against a stand-in for the driver's few calls it makes -----------
# (the mapping, the huge-page advice and the population are the real system calls; only the
# driver's registration is stood in for, since this machine has no GPU)

class _StubDriver:
    """cuMemHostRegister answers `rc`; every (un)registration and pinned allocation is recorded."""

    def __init__(self, rc: int = 0):
        self.rc, self.calls, self.buffers = rc, [], {}

    def cuMemHostRegister_v2(self, p, size, flags):
        self.calls.append(("register", p.value, size))
        return self.rc

    def cuMemHostUnregister(self, p):
        self.calls.append(("unregister", p.value))
        return 0

    def cuMemHostAlloc(self, pp, size, flags):
        import ctypes

        buf = ctypes.create_string_buffer(size + 4096)
        addr = ctypes.addressof(buf)
        self.buffers[addr] = buf
        pp._obj.value = addr
        self.calls.append(("alloc", addr, size))
        return 0

    def cuMemFreeHost(self, p):
        self.calls.append(("free", p))
        return 0

    def cuCtxGetCurrent(self, pp):
        pp._obj.value = 1
        return 0

    def cuGetErrorString(self, rc, pp):
        return 0  # no text: the message says "CUresult {rc}"


@pytest.fixture
def stub():
    """A stand-in driver library answering cuMemHostRegister with `rc`, passed to what is tested
    (`cu=`): nothing in the driver module is replaced."""
    return _StubDriver


def _mapped(addr: int) -> bool:
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return True
    return False


@pytest.mark.parametrize("nbytes", [4096, 100_000, 2 << 20, (3 << 20) + 4096, 16 << 20])
def test_registered_memory_registers_what_it_maps_and_gives_both_back(stub, nbytes):
    s = stub(0)
    mem = driver.RegisteredMemory(nbytes, s)
    ptr = mem.ptr
    (kind, addr, size), = s.calls
    assert kind == "register" and addr == ptr and size == -(-nbytes // 4096) * 4096
    assert ptr % 4096 == 0 and (nbytes < (2 << 20) or ptr % (2 << 20) == 0)
    assert mem.length == size  # the huge-page padding is unmapped at once: no page beyond the plan's bytes
    arr = np.asarray(mem)
    arr[:] = 7  # populated, writable, and exactly nbytes long
    assert arr.nbytes == nbytes and _mapped(ptr) and _mapped(ptr + size - 1)
    del arr, mem
    assert s.calls[-1] == ("unregister", ptr)
    assert not _mapped(ptr)


@pytest.mark.parametrize("rc, code", [(801, "pin-refused"), (2, "host-memory")])
def test_a_refused_registration_leaves_nothing_mapped_or_registered(stub, rc, code):
    from planc.base.errors import ExecuteError

    s = stub(rc)
    with pytest.raises(ExecuteError) as ei:
        driver.RegisteredMemory(8 << 20, s)
    assert ei.value.code == code and "cuMemHostRegister" in ei.value.message
    import gc

    del ei
    gc.collect()
    (kind, base, length), = s.calls  # never unregistered: it was never registered
    assert kind == "register" and not any(_mapped(a) for a in range(base, base + length, 4096))


def test_the_gpu_falls_back_to_host_alloc_only_when_registration_is_refused(stub, monkeypatch):
    from planc.base.errors import ExecuteError
    from planc.execute.device.seam import Gpu

    monkeypatch.delenv("PLANC_PIN", raising=False)
    s = stub(2)  # out of memory: no fallback, the load fails typed
    g = Gpu(cu=s)
    with pytest.raises(ExecuteError, match="cuMemHostRegister"):
        g.pinned_bytes(1 << 20)
    assert g.pin_method() == "register"
    s.rc = 801  # not supported here: cuMemHostAlloc, from now on
    buf = g.pinned_bytes(1 << 20)
    assert g.pin_method() == "alloc" and buf.nbytes == 1 << 20
    assert [c[0] for c in s.calls] == ["register", "register", "alloc"]
    more = g.pinned_bytes(4096)
    assert [c[0] for c in s.calls] == ["register", "register", "alloc", "alloc"]  # registration not tried again
    del buf, more
