"""Kernel launches through the driver, from PTX shipped with the package: no compile at load time.

numba's first launch of a kernel in a process costs 0.5-1 s and about 100 MB of host memory (LLVM)
even when its on-disk cache hits: typing the arguments, setting up the CUDA target, rebuilding the
cached library. In a load of a few seconds that is most of the difference from a pure copy. So
every launch the executor makes (`planc.execute.kernels.signatures`) is built to PTX ahead of time
(`planc.execute.kernels.ptxbuild`), and the PTX to machine code for each shipped capability (`ptxas`),
both shipped in `planc/execute/kernels/ptx`. A launch loads its kernel's cubin with `cuModuleLoadData` on
a device of the cubin's major capability (nothing is compiled, not even by the driver: the first
load on a new machine is like any other), else the PTX (the driver JIT-compiles it for the device
and keeps the result in its own compute cache, so a later process skips even that), and calls
`cuLaunchKernel` with the arguments packed as numba's kernel ABI lays them out:

* an array is (meminfo, parent, nitems, itemsize, data, shape[ndim], strides[ndim]), each 8 bytes;
* an int64 scalar is 8 bytes.

Only when a launch has no usable PTX (a signature not shipped, a device below the lowest shipped
capability, a driver that refuses the PTX's ISA version, or an index built from other kernel
sources) does it take the earlier path: numba compiles the kernel at its first launch, its cubin
is written to `~/.cache/planc/kernels` (or `PLANC_KERNEL_DIR`), and later launches, in this process
or the next, load that cubin. `Launcher.stats()` counts each kind of load (`kernels_compiled` is the number
of launches numba compiled) and says why each fallback happened.

The cubin's file name hashes the kernel's name and signature, the device's compute capability,
the numba-cuda version and the source of the kernel modules, so a changed kernel is compiled anew.
With `PLANC_RAW_LAUNCH=0` every launch goes through numba; the simulator's launches never come here
(`seam.Simulator.launch` runs numba's kernels as threads). Launches are named (`device.launch(name,
...)`, on a GPU `Launcher.go`); the numba kernel behind a name is looked up, and numba imported,
only when a launch goes through numba. The driver calls a launcher makes are an object
(`DriverCalls`) it is given, so a test stands in for the driver without patching this module.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np

from ...base import settings
from . import driver
from ..kernels import ptxindex, signatures

_dir: Path | None = None
_salt: str | None = None
_COUNTS = ("kernels_from_shipped_cubin", "kernels_from_ptx", "kernels_from_cubin", "kernels_compiled")


def enabled(dev) -> bool:
    """Launch through the driver: on a device that loads kernel modules (a GPU, not the simulator),
    unless PLANC_RAW_LAUNCH=0."""
    return settings.raw_launch() and dev.loads_kernels


def since(before: dict, now: dict) -> dict:
    """The counts of the `Launcher.stats()` snapshot `now`, less those of the snapshot `before`."""
    out = {k: now[k] - before.get(k, 0) for k in _COUNTS}
    out["fallbacks"] = now["fallbacks"][len(before.get("fallbacks", [])):]
    return out


def no_stats() -> dict:
    """The counts of a device that loads no modules (the simulator runs numba's kernels as threads)."""
    return {**dict.fromkeys(_COUNTS, 0), "fallbacks": []}


def _cache_dir() -> Path | None:
    global _dir
    d = settings.kernel_dir()
    if _dir != d:  # checked once per folder (a call's settings may name another)
        try:
            d.mkdir(parents=True, exist_ok=True)
            if not os.access(d, os.W_OK):
                return None
        except OSError:
            return None
        _dir = d
    return _dir


def _source_salt() -> str:
    """What the compiled code depends on besides the signature: the kernel sources and numba-cuda."""
    global _salt
    if _salt is None:
        h = hashlib.sha256()
        for path in [signatures.SOURCE_DIR / name for name in signatures.SOURCES] + [Path(__file__)]:
            h.update(path.read_bytes())
        try:
            from importlib.metadata import version

            h.update(version("numba-cuda").encode() + version("numba").encode())
        except Exception:  # noqa: BLE001 - unknown version: the sources alone
            pass
        _salt = h.hexdigest()[:16]
    return _salt


def signature(args) -> tuple | None:
    """The argument signature: ('a', dtype, ndim) per C-contiguous device array, ('i',) per integer;
    None when an argument is anything else (that launch goes through numba)."""
    sig = []
    for a in args:
        if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
            sig.append(("i",))
        elif hasattr(a, "device_ctypes_pointer") and getattr(a, "is_c_contiguous", lambda: False)():
            sig.append(("a", np.dtype(a.dtype).str, a.ndim))
        else:
            return None
    return tuple(sig)


def pack(args) -> list[int]:
    """numba's kernel ABI, each value 8 bytes (see the module docstring)."""
    vals: list[int] = []
    for a in args:
        if isinstance(a, (int, np.integer)):
            vals.append(int(a))
        else:
            item = np.dtype(a.dtype).itemsize
            vals += [0, 0, int(a.size), item, int(a.device_ctypes_pointer.value or 0)]
            vals += [int(s) for s in a.shape]
            vals += [int(s) for s in a.strides]
    return vals


def _dims(x) -> tuple[int, int, int]:
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    t = tuple(int(v) for v in t) + (1,) * (3 - len(t))
    return t[0], t[1], t[2]


def _file(folder: Path, name: str, sig: tuple, cc: tuple) -> Path:
    key = json.dumps([name, sig, list(cc), _source_salt()])
    return folder / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".cubin")


def kernel_of(name: str, target: str):
    """The numba kernel behind a launch name, built for `target` (the device's `target`; imports
    numba and the kernels' source)."""
    from ..kernels import fp4_kernels, gguf_kernels, kernels, scatter

    if name.startswith("gguf_"):
        return gguf_kernels.kernels(target)[name]
    return {**kernels.KERNELS, **scatter.KERNELS, **fp4_kernels.KERNELS}[name]


_numba_streams: dict = {}


def _numba_stream(stream):
    """The stream as numba launches on it: numba's view of a driver stream."""
    if stream == 0 or not hasattr(stream, "handle") or not isinstance(stream.handle, int):
        return stream
    s = _numba_streams.get(stream.handle)
    if s is None:
        from numba import cuda

        s = _numba_streams[stream.handle] = cuda.external_stream(stream.handle)
    return s


def _matches(types, sig: tuple) -> bool:
    from numba.core import types as nt

    if len(types) != len(sig):
        return False
    for t, s in zip(types, sig):
        if s[0] == "i":
            if t != nt.int64:
                return False
        elif not (isinstance(t, nt.Array) and t.layout == "C" and t.ndim == s[2]
                  and np.dtype(str(t.dtype)).str == s[1]):
            return False
    return True


_local = threading.local()


def _params(n: int):
    """This thread's argument buffer of `n` 8-byte values and the array of pointers to them that
    `cuLaunchKernel` takes: made once per thread and count, refilled for each launch (the driver
    copies the arguments before the call returns)."""
    made = getattr(_local, "params", None)
    if made is None:
        made = _local.params = {}
    got = made.get(n)
    if got is None:
        buf = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(buf)
        got = made[n] = (buf, (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)]))
    return got


class DriverCalls:
    """The driver calls a launch makes: the thread's context, module loads, the launch itself, the
    argument signature and the cubin cache's folder (a test of the launcher passes a stand-in)."""

    def context(self) -> int:
        """This thread's current CUDA context (made current first where the thread has none, so that
        a module load never fails for want of one): loaded modules belong to it."""
        return driver.ensure_context()

    def module_function(self, image: bytes, entry: str, keep: list) -> tuple[int | None, int]:
        """(CUfunction, 0) of `entry` in a PTX or cubin image, or (None, the failing CUresult);
        the loaded module goes into `keep` (modules stay for the process: a few KiB each)."""
        cu = driver.lib()
        mod, f = ctypes.c_void_p(), ctypes.c_void_p()
        rc = cu.cuModuleLoadData(ctypes.byref(mod), image)
        if rc == 0:
            keep.append(mod)
            rc = cu.cuModuleGetFunction(ctypes.byref(f), mod, entry.encode())
        return (int(f.value), 0) if rc == 0 else (None, rc)

    def error_text(self, rc: int) -> str:
        return driver.error_text(rc)

    def signature(self, args) -> tuple | None:
        return signature(args)

    def cache_dir(self) -> Path | None:
        return _cache_dir()

    def launch(self, fn: int, grid, block, stream, args) -> None:
        vals = pack(args)
        buf, params = _params(len(vals))
        buf[:] = vals  # ctypes wraps a negative value to its two's complement, as the ABI has it
        gx, gy, gz = _dims(grid)
        bx, by, bz = _dims(block)
        h = stream if isinstance(stream, int) else stream.handle
        h = int(getattr(h, "value", h) or 0)  # a driver.Stream's int, or a numba stream's CUstream object
        driver.check(driver.issue_lib().cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, 0, h, params, None), "cuLaunchKernel")


class Launcher:
    """A GPU's kernel launches by name: the loaded functions, what fell back to numba and why, and
    the counts of each kind of module load (`stats`). `LAUNCHER` is the process's; `calls` are the
    driver calls it makes (`DriverCalls`); `index`: a callable giving the shipped PTX's table as
    `ptxindex.usable()` does (None: that)."""

    def __init__(self, calls=None, index=None):
        self.calls = DriverCalls() if calls is None else calls
        self.index = ptxindex.usable if index is None else index
        self.lock = threading.Lock()
        self.functions: dict = {}  # (name, signature, context) -> CUfunction handle (int)
        self.modules: list = []  # loaded modules stay for the process (a few KiB each)
        self.given_up: set = set()  # (name, signature) whose cubin could not be written
        self.compiled: set = set()  # (name, signature) launched through numba: compiled in this process
        self.bad_ptx: dict = {}  # (name, signature, cc) -> why the driver refused the shipped PTX
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.fallbacks: list[str] = []  # why each compiled launch had no shipped PTX (in order)

    def stats(self) -> dict:
        """Module loads so far: from shipped PTX, from the cubin cache, compiled by numba (with why
        each had no shipped PTX). `since` turns two snapshots into one load's counts."""
        with self.lock:
            return {**self.counts, "fallbacks": list(self.fallbacks)}

    def _module_function(self, image: bytes, entry: str):
        return self.calls.module_function(image, entry, self.modules)

    def _load_shipped(self, name: str, sig: tuple, cc: tuple) -> tuple[int | None, str | None]:
        """(the function from the shipped PTX, None), or (None, why it cannot serve this launch)."""
        bad = self.bad_ptx.get((name, sig, cc))
        if bad:
            return None, bad
        e, why = ptxindex.choose(name, sig, cc, self.index())
        if e is None:
            return None, why
        cubin = ptxindex.cubin_for(e, cc)
        if cubin is not None:  # machine code built ahead for this capability: the driver compiles nothing
            try:
                fn, _rc = self._module_function(cubin.read_bytes(), e.entry)
            except OSError:
                fn = None
            if fn is not None:
                self.counts["kernels_from_shipped_cubin"] += 1
                return fn, None
        try:
            image = ptxindex.path_of(e).read_bytes()
        except OSError as err:
            why = f"{name} {e.file}: shipped PTX unreadable ({err})"
        else:
            fn, rc = self._module_function(image, e.entry)
            if fn is not None:
                self.counts["kernels_from_ptx"] += 1
                return fn, None
            why = (f"{name} {e.file}: the driver refused PTX {e.ptx_version} for sm_{cc[0]}{cc[1]}: "
                   f"{self.calls.error_text(rc)}"
                   + (" (the driver is older than the NVVM that built it)" if rc == 222 else ""))
        self.bad_ptx[(name, sig, cc)] = why
        return None, why

    def load(self, dev, name: str, sig: tuple) -> tuple[int | None, str | None]:
        """(CUfunction for the launch on `dev`, None), or (None, why there is no shipped PTX for it):
        from the shipped PTX first, then from the cubin cache of an earlier numba compile."""
        key = (name, sig, self.calls.context())
        fn = self.functions.get(key)
        if fn is not None:
            return fn, None
        with self.lock:
            if key in self.functions:
                return self.functions[key], None
            cc = tuple(dev.compute_capability())
            fn, why = self._load_shipped(name, sig, cc)
            if fn is not None:
                self.functions[key] = fn
                return fn, None
            folder = self.calls.cache_dir()
            if folder is None:
                return None, why
            path = _file(folder, name, sig, cc)
            try:
                meta = json.loads(path.with_suffix(".json").read_text())
                image = path.read_bytes()
            except (OSError, ValueError):
                meta = None
            if meta is not None:
                fn, _rc = self._module_function(image, str(meta.get("entry", "")))
                if fn is None:
                    # A damaged or foreign file: dropped, so that numba compiles the kernel and writes it anew.
                    for p in (path, path.with_suffix(".json")):
                        try:
                            p.unlink()
                        except OSError:
                            pass
                    return None, why
                self.functions[key] = fn
                self.counts["kernels_from_cubin"] += 1
                if (name, sig) not in self.compiled:  # not this process's own compile, counted already
                    self.fallbacks.append(f"{why}; loaded the cubin of an earlier compile")
            return fn, why

    def _save(self, dev, kernel, name: str, sig: tuple) -> bool:
        """After numba launched `kernel`, write its cubin for `sig`; False when it could not (best
        effort: a failure only means that launches of it go through numba)."""
        folder = self.calls.cache_dir()
        if folder is None:
            return False
        try:
            cc = tuple(dev.compute_capability())
            for types, ov in list(kernel.overloads.items()):
                if _matches(types, sig):
                    lib = ov._codelibrary
                    if getattr(lib, "_setup_functions", None) or getattr(lib, "_teardown_functions", None):
                        return False
                    obj = lib.get_cubin(cc=cc)  # bytes, or a cuda.core ObjectCode holding them
                    image = getattr(obj, "code", obj)
                    if not isinstance(image, (bytes, bytearray)):
                        return False
                    entry = lib._entry_name
                    entry = (getattr(obj, "symbol_mapping", None) or {}).get(entry, entry)
                    path = _file(folder, name, sig, cc)
                    ident = f".{os.getpid()}.{threading.get_ident()}.tmp"
                    tmp = path.with_suffix(ident)
                    tmp.write_bytes(bytes(image))
                    os.replace(tmp, path)
                    meta = path.with_suffix(".json")
                    tmp = meta.with_suffix(ident)
                    tmp.write_text(json.dumps({"entry": entry, "name": name, "signature": sig}))
                    os.replace(tmp, meta)
                    return True
        except Exception:  # noqa: BLE001 - the cache is an optimization
            return False
        return False

    def _count_compile(self, name: str, sig, why: str) -> None:
        with self.lock:
            if (name, sig) not in self.compiled:
                self.compiled.add((name, sig))
                self.counts["kernels_compiled"] += 1
                self.fallbacks.append(f"{why}; compiled by numba")

    def go(self, dev, name: str, grid, block, stream, *args, kernel=None) -> None:
        """Launch the kernel named `name` with `args` on `stream` of GPU `dev` (`kernel`: its numba
        kernel, when the caller has it; looked up by name only if the launch goes through numba)."""
        if enabled(dev):
            sig = self.calls.signature(args)
            if sig is None:
                self._count_compile(name, sig, f"{name}: an argument other than a C-contiguous array or an int")
            elif (name, sig) not in self.given_up:
                fn, why = self.load(dev, name, sig)
                if fn is not None:
                    self.calls.launch(fn, grid, block, stream, args)
                    return
                self._count_compile(name, sig, why)
                kernel = kernel or kernel_of(name, dev.target)
                kernel[grid, block, _numba_stream(stream)](*args)
                if not self._save(dev, kernel, name, sig):
                    self.given_up.add((name, sig))  # numba launches this one from now on, without asking the disk
                return
        else:
            self._count_compile(name, self.calls.signature(args), f"{name}: PLANC_RAW_LAUNCH=0")
        kernel = kernel or kernel_of(name, dev.target)
        kernel[grid, block, _numba_stream(stream)](*args)


LAUNCHER = Launcher()
