"""The PTX shipped in planc/execute/kernels/ptx is complete and current, checked without a GPU.

Complete: every launch the executor can make (each op and dtype pair the compiler can emit, each
scatter width the schedule picks) is in `planc.execute.kernels.signatures`, found here by driving the
real dispatchers under the simulator on a recording device (what they hand to `device.launch`); and every one of
those has a PTX file per shipped compute capability. Current: the index's source hash is that of
today's kernel sources, so a kernel edited without building the PTX again fails here, with the
command that rebuilds it.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import re  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402

from planc.base.dtypes import DTYPES, FLOAT_CONVERTIBLE, FP8_DEQUANTIZABLE  # noqa: E402
from planc.execute.kernels import ptxindex, signatures  # noqa: E402

INDEX = ptxindex.read()


def test_index_was_built_from_the_current_kernel_sources():
    why = ptxindex.stale_reason(INDEX)
    assert why is None, f"{why}, then commit planc/execute/kernels/ptx"
    assert signatures.REBUILD in ptxindex.stale_reason({"source_hash": "other"})


def test_every_launch_has_ptx_for_every_capability():
    have = {(e.name, e.signature, e.cc): e for e in INDEX["kernels"]}
    missing = [f"{n} {signatures.sig_tag(s)} sm_{cc[0]}{cc[1]}" for n, s in signatures.launches()
               for cc in signatures.CCS if (n, s, cc) not in have]
    assert not missing, f"no shipped PTX for {missing}; rebuild it with `{signatures.REBUILD}`"
    assert [tuple(c) for c in INDEX["ccs"]] == list(signatures.CCS)


def test_each_ptx_file_holds_its_entry_for_its_capability():
    for e in INDEX["kernels"]:
        text = ptxindex.path_of(e).read_text()
        assert re.search(rf"^\.target sm_{e.cc[0]}{e.cc[1]}\b", text, re.M), e.file
        assert re.search(rf"\.entry {re.escape(e.entry)}\(", text), e.file
        assert re.search(rf"^\.version {re.escape(e.ptx_version)}$", text, re.M), e.file


def test_no_stray_files():
    listed = {e.file for e in INDEX["kernels"]}
    on_disk = {p.name for p in ptxindex.DIR.glob("*.ptx")}
    assert on_disk == listed
    assert len(listed) == len(INDEX["kernels"]) == len(signatures.launches()) * len(signatures.CCS)


def test_every_ptx_has_machine_code_built_from_it():
    import hashlib
    import json

    doc = json.loads(ptxindex.CUBINS.read_text())
    for e in INDEX["kernels"]:
        got = doc["cubins"].get(e.file)
        assert got, f"no cubin for {e.file}; rebuild with `{signatures.REBUILD}`"
        assert got["ptx_sha256"] == hashlib.sha256(ptxindex.path_of(e).read_bytes()).hexdigest(), \
            f"{got['cubin']} was built from another {e.file}; rebuild with `{signatures.REBUILD}`"
        assert (ptxindex.DIR / got["cubin"]).read_bytes()[:4] == b"\x7fELF"
    assert {p.name for p in ptxindex.DIR.glob("*.cubin")} == {v["cubin"] for v in doc["cubins"].values()}


def test_machine_code_serves_only_its_major_capability(tmp_path):
    name, sig = signatures.zero_launch()
    e90 = ptxindex.choose(name, sig, (9, 0))[0]
    assert ptxindex.cubin_for(e90, (9, 0)).name == e90.file.replace(".ptx", ".cubin")
    assert ptxindex.cubin_for(ptxindex.choose(name, sig, (10, 0))[0], (10, 0)) is None  # the PTX, JIT-compiled
    e86 = ptxindex.choose(name, sig, (8, 6))[0]
    assert ptxindex.cubin_for(e86, (8, 6)).name.endswith(".sm80.cubin")
    # a cubin built from another PTX than the one shipped is not used
    table = dict(ptxindex._cubins())
    assert ptxindex.cubin_for(e90, (9, 0), {**table, e90.file: (table[e90.file][0], "0" * 64)}) is None


def test_choose_takes_the_highest_capability_not_above_the_device():
    name, sig = signatures.zero_launch()
    assert ptxindex.choose(name, sig, (9, 0))[0].cc == (9, 0)
    assert ptxindex.choose(name, sig, (10, 0))[0].cc == (9, 0)
    assert ptxindex.choose(name, sig, (8, 6))[0].cc == (8, 0)
    e, why = ptxindex.choose(name, sig, (7, 5))
    assert e is None and "sm_80 and up" in why
    e, why = ptxindex.choose(name, (("i",),), (9, 0))
    assert e is None and "no shipped PTX" in why


def test_signature_strings_are_numpys():
    for s, t in ((signatures._UINT[1], np.uint8), (signatures._UINT[2], np.uint16), (signatures._UINT[4], np.uint32),
                 (signatures._UINT[8], np.uint64), (signatures.F32, np.float32), (signatures.I64, np.int64)):
        assert np.dtype(t).str == s


# -- every launch the executor makes is listed ------------------------------------------------------


def _recorded_signatures(dev) -> set:
    """(name, signature) of every launch `dev` (an execute_support.RecordingDevice) recorded."""
    seen = set()
    for name, _grid, _block, args in dev.launches:
        sig = []
        for a in args:
            if isinstance(a, (int, np.integer)):
                sig.append(("i",))
            else:
                assert a.flags["C_CONTIGUOUS"] if hasattr(a, "flags") else a.is_c_contiguous(), name
                sig.append(("a", np.dtype(a.dtype).str, a.ndim))
        seen.add((name, tuple(sig)))
    return seen


def test_the_table_is_every_launch_the_dispatchers_make():
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("records launches under the simulator")
    from functools import partial

    from execute_support import RecordingDevice

    from planc.execute.kernels import dispatch
    from planc.execute.device.seam import default_device
    from planc.compiler.schedule import _width

    dev = RecordingDevice(default_device(), forward=False)
    kernels = type("Dispatch", (), {n: staticmethod(partial(getattr(dispatch, n), dev=dev))
                                    for n in ("convert", "convert_add", "dequantize_fp8", "transpose2d", "scatter",
                                              "zero")})

    buf = cuda.device_array(4096, dtype=np.uint8)
    out = cuda.device_array(4096, dtype=np.uint8)
    for a in sorted(FLOAT_CONVERTIBLE):  # every convert the compiler emits (bind: F32 / F16 / BF16 only)
        for b in sorted(FLOAT_CONVERTIBLE):
            kernels.convert(buf, out, a, b, 16)
            kernels.convert_add(buf, out, a, b, 16, -1.0)  # a rule's `add`
            if DTYPES[a].bits == DTYPES[b].bits:
                kernels.convert(buf, buf, a, b, 16)  # in place
                kernels.convert_add(buf, buf, a, b, 16, -1.0)
    for f in sorted(FP8_DEQUANTIZABLE):  # dequantize: an FP8 source into a float target
        for b in sorted(FLOAT_CONVERTIBLE):
            kernels.dequantize_fp8(buf[:64], buf[64:128], out, f, b, 8, 8, 8)
    sizes = sorted({d.bits // 8 for d in DTYPES.values() if d.bits % 8 == 0})  # transpose: any whole-byte dtype
    for s in sizes:
        kernels.transpose2d(buf, out, 4, 4, s)
    Copy = type("Copy", (), {})
    widths = set()
    for w in (1, 2, 4, 8):  # the widths the schedule can pick for a scattered request
        c = Copy()
        c.slot_offset = c.dst_offset = c.nbytes = w * 3
        widths.add(_width([c]))
    table = cuda.to_device(np.zeros((1, 3), np.int64))
    for w in sorted(widths):
        kernels.scatter(buf, out, table, 0, 1, w, 0)
    kernels.zero(out, [(0, 64)], 0)
    from planc.execute.kernels.gguf_dispatch import dequantize_gguf
    from planc.manifest.ggml_types import DEQUANTIZABLE

    assert sorted(DEQUANTIZABLE) == list(signatures.GGUF_DEQUANTIZABLE)
    wide = {"F32": cuda.device_array(256, np.uint32), "F16": cuda.device_array(256, np.uint16),
            "BF16": cuda.device_array(256, np.uint16)}
    for t in sorted(DEQUANTIZABLE):  # GGUF blocks into each float target
        for b in sorted(FLOAT_CONVERTIBLE):
            dequantize_gguf(buf, wide[b], t, b, 256, dev=dev)
    from planc.execute.kernels.fp4_dispatch import dequantize_fp4

    for fmt in ("mxfp4", "nvfp4"):  # FP4 into every float target, as stored and transposed
        for b in sorted(FLOAT_CONVERTIBLE):
            for t in (False, True):
                dequantize_fp4(buf[:64], buf[64:72], buf[128:132], out, fmt, b, 1, 2, 64, t, dev=dev)
    recorded = _recorded_signatures(dev)
    listed = set(signatures.launches())
    assert recorded - listed == set(), f"launches without shipped PTX: {sorted(recorded - listed)}"
    assert listed - recorded == set(), f"listed but never launched: {sorted(listed - recorded)}"


def test_every_listed_kernel_name_has_a_dispatcher():
    from planc.execute.kernels import ptxbuild

    reg = ptxbuild.registry()
    assert {n for n, _ in signatures.launches()} <= set(reg)


# -- the load path, with the driver calls stood in for ------------------------------------------------


class _Kernel:
    """A numba kernel as `Launcher.go` sees it: `kernel[grid, block, stream](*args)` launches (and compiles)."""

    def __init__(self):
        self.launched = 0
        self.overloads = {}

    def __getitem__(self, conf):
        def run(*args):
            self.launched += 1
        return run


class _StandInDriver(list):
    """The driver calls of a launcher (`launch.DriverCalls`) on a device of capability 9.0: each
    module load is recorded (image head, entry), then each launch; `refuse`: a CUresult it answers
    cuModuleLoadData with; `refuse_cubin`: whether it refuses machine code (ELF) but takes PTX.
    Arguments are stand-ins: two make the zero kernel's signature, any other count none."""

    refuse = None
    refuse_cubin = False
    loads_kernels = True

    def context(self) -> int:
        return 1

    def compute_capability(self) -> tuple:
        return (9, 0)

    def module_function(self, image, entry, keep):
        self.append((image[:200], entry))
        if self.refuse_cubin and image[:4] == b"\x7fELF":
            return None, 209  # CUDA_ERROR_NO_BINARY_FOR_GPU
        return (len(self), 0) if self.refuse is None else (None, self.refuse)

    def error_text(self, rc: int) -> str:
        return f"error {rc}"

    def signature(self, args):
        return signatures.zero_launch()[1] if len(args) == 2 else None

    def cache_dir(self):
        return None

    def launch(self, fn, grid, block, stream, args) -> None:
        self.append(("launch", fn))


@pytest.fixture
def driver():
    """A `launch.Launcher` of its own on a stand-in driver (`_StandInDriver`, also the device: its
    capability is asked of it); returns the stand-in, `go` launching through the launcher."""
    from planc.execute.device import launch

    calls = _StandInDriver()
    launcher = launch.Launcher(calls)
    calls.launcher = launcher
    calls.go = lambda *a, **k: launcher.go(calls, *a, **k)
    return calls


def test_a_launch_loads_its_shipped_ptx_once_and_compiles_nothing(driver):
    from planc.execute.device import launch

    k, before = _Kernel(), driver.launcher.stats()
    for _ in range(3):
        driver.go("zero", 1, 32, 0, object(), 5, kernel=k)
    got = launch.since(before, driver.launcher.stats())
    assert k.launched == 0 and got == {"kernels_from_shipped_cubin": 1, "kernels_from_ptx": 0, "kernels_from_cubin": 0,
                                       "kernels_compiled": 0, "fallbacks": []}
    image, entry = driver[0]
    assert image[:4] == b"\x7fELF" and entry == ptxindex.choose("zero", signatures.zero_launch()[1], (9, 0))[0].entry
    assert [x for x in driver if x[0] == "launch"] == [("launch", 1)] * 3


def test_machine_code_the_driver_refuses_leaves_the_ptx(driver):
    from planc.execute.device import launch

    driver.refuse_cubin = True
    k, before = _Kernel(), driver.launcher.stats()
    driver.go("zero", 1, 32, 0, object(), 5, kernel=k)
    got = launch.since(before, driver.launcher.stats())
    assert k.launched == 0 and got["kernels_from_ptx"] == 1 and got["kernels_from_shipped_cubin"] == 0
    assert driver[0][0][:4] == b"\x7fELF" and b".target sm_90" in driver[1][0]


def test_a_signature_without_ptx_is_compiled_and_counted_once(driver):
    k = _Kernel()
    for _ in range(2):
        driver.go("zero", 1, 32, 0, object(), 5, 6, kernel=k)  # signature None: numba's launch
        driver.go("nonesuch", 1, 32, 0, object(), 5, kernel=k)
    got = driver.launcher.stats()
    assert k.launched == 4 and got["kernels_compiled"] == 2 and got["kernels_from_ptx"] == 0
    assert "no shipped PTX for this signature; compiled by numba" in got["fallbacks"][1]


def test_ptx_the_driver_refuses_falls_back_with_the_reason(driver):
    driver.refuse = 222
    k = _Kernel()
    driver.go("zero", 1, 32, 0, object(), 5, kernel=k)
    driver.go("zero", 1, 32, 0, object(), 5, kernel=k)
    got = driver.launcher.stats()
    assert k.launched == 2 and got["kernels_compiled"] == 1 and len(driver) == 2  # cubin and PTX once, not retried
    assert "refused PTX" in got["fallbacks"][0] and "older than the NVVM" in got["fallbacks"][0]


def test_a_stale_index_is_not_used(driver):
    from planc.execute.device import launch

    stale = ptxindex.table_of({**ptxindex.read(), "source_hash": "built from other sources"})
    launcher = launch.Launcher(driver, index=lambda: stale)
    k = _Kernel()
    launcher.go(driver, "zero", 1, 32, 0, object(), 5, kernel=k)
    got = launcher.stats()
    assert k.launched == 1 and driver == [] and got["kernels_compiled"] == 1
    assert signatures.REBUILD in got["fallbacks"][0]


def test_raw_launch_off_goes_through_numba(monkeypatch):
    from planc.execute.device import launch, seam

    monkeypatch.setenv("PLANC_RAW_LAUNCH", "0")
    assert not launch.enabled(seam.device())


def test_the_shipped_launches_are_the_formats_own():
    """Each kernel format's class lists its launches (`planc.execute.kernels.formats`); with the scatter and the
    zero-fill they are every launch the PTX is built for, each once (two same-width copies are one launch)."""
    from planc.execute.kernels.formats import FORMATS

    own = [x for f in FORMATS.values() for x in f.launches()]
    rest = [signatures.scatter_launch(w) for w in signatures.SCATTER_WIDTHS] + [signatures.zero_launch()]
    shipped = signatures.launches()
    assert len(shipped) == len(set(shipped)) and set(own + rest) == set(shipped)
