"""The digest's read-and-hash loop in machine code (`native/readhash.c`, built for x86-64 Linux when
planc is installed: `setup.py`, or `tools/build_native.sh` in place): one request read a piece at a
time into its ring slot, each span (a leaf, or a witness's part of one) hashed with xxh3-128 while
its bytes are in the core's cache, the whole request in one call that lets the other readers run.
Hashing in Python instead costs a second pass over the slot from memory (the host's memory traffic
grows by a third, docs/reload.md).

The loop calls libc's `pread` through a function pointer and hashes spans of more than 240 bytes
with XXH3's long-input path written in it, with AVX-512 or AVX2 where the processor and the system
have them (`PLANC_DIGEST_HASH`); shorter spans are hashed here with the xxhash package after the
call. The digests are `xxhash.xxh3_128`'s, and `load()` checks them against the package before the
loop is used. `load()` is None where the built object is missing or stale (another architecture, an
install without a C compiler): the verifier then hashes in Python, with the same digests.
"""

from __future__ import annotations

import ctypes
import json
import hashlib
import platform
import threading
from pathlib import Path

import xxhash

DIR = Path(__file__).with_name("native")
OBJECT = DIR / "readhash.x86_64-linux.so"
SOURCE = DIR / "readhash.c"
INDEX = DIR / "native.json"
PIECE = 256 << 10  # bytes per read: hashed while in the core's cache (docs/reload.md)
# How the loop hashes: "best" (the widest this machine runs), or a level's name. A load's comes from
# PLANC_DIGEST_HASH.
LEVELS = {"scalar": 1, "avx2": 2, "avx512": 3}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}

_lock = threading.Lock()
_loaded: list = []  # [ReadHash | None] once tried
why_not: str | None = None  # why `load()` is None


REBUILD = ("install planc again where a C compiler is (its install builds it), or in a checkout run "
           "tools/build_native.sh")


def stale_reason(obj: Path = OBJECT, index: Path = INDEX, source: Path = SOURCE) -> str | None:
    """Why the built object `obj` must not be used (absent, or not what `index` says was built from
    `source`), or None."""
    if not obj.is_file():
        return f"{obj.name} was not built when planc was installed (no C compiler?): {REBUILD}"
    try:
        doc = json.loads(index.read_text())[obj.name]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{index} does not list {obj.name}: {REBUILD}"
    if doc.get("source_sha256") != hashlib.sha256(source.read_bytes()).hexdigest():
        return f"{obj.name} was built from another {source.name}: {REBUILD}"
    if doc.get("sha256") != hashlib.sha256(obj.read_bytes()).hexdigest():
        return f"{obj.name} is not the object {index.name} lists: {REBUILD}"
    return None


def _self_check(rh: "ReadHash") -> str | None:
    """Why `rh`'s digests are not the xxhash package's (a stripe path that errs), or None: spans of
    the lengths where XXH3 changes its course read and hashed from a file in memory, piece by piece,
    at every level this machine runs, against `xxhash.xxh3_128`."""
    import os

    import numpy as np

    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    fd = os.memfd_create("planc-readhash-check") if hasattr(os, "memfd_create") else None
    if fd is None:
        return None
    try:
        os.write(fd, data)
        buf = np.zeros(len(data), np.uint8)
        spans, at = [], 0
        for n in (100, 240, 241, 1024, 1025, 1088, 16384, 16385, 70_000, 100_000):
            spans.append((at, at + n))
            at += n + 3
        spans.append((at + 1, len(data)))
        want = [xxhash.xxh3_128(data[a:b]).digest() for a, b in spans]
        for level in sorted({n for n in LEVELS.values() if n <= rh.widest}):
            got, digests = rh.read(fd, buf, 0, len(data), len(data), 65536, False, spans, LEVEL_NAMES[level])
            if got != len(data) or digests != want:
                return f"the read-and-hash loop's digests ({LEVEL_NAMES[level]}) differ from the xxhash package's"
    finally:
        os.close(fd)
    return None


class ReadHash:
    """The loaded loop; `read(...)` on any thread."""

    MAX_SHORT = 240  # spans this long or shorter are hashed with the package, after the call

    def __init__(self, obj: ctypes.CDLL, libc: ctypes.CDLL):
        f = obj.planc_read_hash
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        f.argtypes = [vp, ctypes.c_int, vp, i64, i64, i64, i64, ctypes.c_int, vp, vp, i64, vp, ctypes.c_int]
        f.restype = i64
        self._fn = f  # a CDLL function: the interpreter's lock is released for the whole call
        self._pread = ctypes.cast(libc.pread, vp).value
        obj.planc_simd.restype, obj.planc_simd.argtypes = ctypes.c_int, []
        self.widest = obj.planc_simd()  # the widest level this processor and system run

    def level(self, simd: str | None = None) -> int:
        """The loop's level for `simd`: a name of LEVELS, capped at what this machine runs, or the
        widest for "best" (or None)."""
        if simd is None or simd == "best":
            return self.widest
        if simd not in LEVELS:
            raise ValueError(f"the read-and-hash loop's level is 'best' or one of {sorted(LEVELS)}, got {simd!r}")
        return min(LEVELS[simd], self.widest)

    def level_name(self, simd: str | None = None) -> str:
        return LEVEL_NAMES[self.level(simd)]

    def read(self, fd: int, buf, offset: int, needed: int, cap: int, piece: int, direct: bool,
             spans: list, simd: str | None = None) -> tuple[int, list]:
        """Read [offset, offset + needed) of `fd` into `buf` (a writable buffer of at least `cap`
        bytes), `piece` at a time, hashing each span `(lo, hi)` (relative to `offset`, sorted,
        disjoint, inside `needed`): those of more than MAX_SHORT bytes as their bytes land, the
        others after. Returns (bytes read, [16-byte digest per span]); bytes read below `needed`
        (the file ended) or -1 (a read failed) come with no digests: read the request again the
        usual way to learn why."""
        mv = memoryview(buf)
        if not mv.contiguous or mv.readonly or mv.nbytes < cap or needed > cap:
            raise ValueError(f"the read needs a writable contiguous buffer of {cap:,} bytes, got {mv.nbytes:,}")
        long = [(a, b) for a, b in spans if b - a > self.MAX_SHORT]
        n = len(long)
        lo = (ctypes.c_int64 * max(n, 1))(*[a for a, _ in long])
        hi = (ctypes.c_int64 * max(n, 1))(*[b for _, b in long])
        out = ctypes.create_string_buffer(16 * max(n, 1))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        got = self._fn(self._pread, fd, addr, offset, needed, cap, piece, int(direct), lo, hi, n, out,
                       self.level(simd))
        if got < needed:
            return got, []
        raw, k, digests = out.raw, 0, []
        flat = mv.cast("B")
        for a, b in spans:
            if b - a > self.MAX_SHORT:
                digests.append(raw[16 * k:16 * k + 16])
                k += 1
            else:
                digests.append(xxhash.xxh3_128_digest(flat[a:b]))
        return got, digests


def load() -> ReadHash | None:
    """The loop, or None where it cannot run here (`why_not` says why); tried once per process."""
    global why_not
    with _lock:
        if _loaded:
            return _loaded[0]
        rh = None
        try:
            if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
                why_not = f"no read-and-hash code for {platform.system()} {platform.machine()}"
            elif (why := stale_reason()) is not None:
                why_not = why
            else:
                rh = ReadHash(ctypes.CDLL(str(OBJECT)), ctypes.CDLL(None))
                why_not = _self_check(rh)
                rh = rh if why_not is None else None
        except (OSError, AttributeError, ImportError, ValueError, MemoryError) as e:
            why_not, rh = f"the read-and-hash code did not load: {e}", None
        _loaded.append(rh)
        return rh
