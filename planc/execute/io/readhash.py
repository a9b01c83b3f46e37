"""The digest's read-and-hash loop in machine code (`native/readhash.c`, built for x86-64 Linux when
planc is installed: `setup.py`, or `tools/build_native.sh` in place): one request read a piece at a time into its ring slot, each piece hashed into its leaf's
xxh3-128 state while it is in the core's cache, the whole request in one call that lets the other
readers run. Hashing in Python instead costs either a second pass over the slot from memory
(leaf-sized pieces: the host's memory traffic grows by a third) or the interpreter's lock traded
between sixteen readers several times a piece (small pieces: 0.10-0.29x of a plain load on the
H200, docs/reload.md).

The loop calls libc's `pread` through a function pointer. It hashes a leaf of more than 240
bytes with XXH3's long-input path written in it, with AVX-512 or AVX2 where the processor and the
system have them (`PLANC_DIGEST_HASH`), and shorter leaves (or all, with `package`) with the xxhash
package's own `XXH3_128bits_reset` / `_update` / `_digest`: the package's library is built for SSE2
and hashes about half as fast a byte. Either way the digests are `xxhash.xxh3_128`'s, and `load()`
checks them against the package before the loop is used. `load()` is None where the built object
or those functions are missing (another architecture, an install without a C compiler, an xxhash
build that does not export them): the verifier then hashes in Python, with the same digests.
"""

from __future__ import annotations

import ctypes
import json
import hashlib
import mmap
import platform
import threading
from pathlib import Path

DIR = Path(__file__).with_name("native")
OBJECT = DIR / "readhash.x86_64-linux.so"
SOURCE = DIR / "readhash.c"
INDEX = DIR / "native.json"
PIECE = 256 << 10  # bytes per read: hashed while in the core's cache (docs/reload.md)
CHUNK = 1 << 20  # bytes copied out of a mapping between making its pages present and unmapping them
# How the loop hashes long leaves: "best" (the widest this machine runs), or a level's name ("package":
# the xxhash package's functions for every leaf). A load's comes from PLANC_DIGEST_HASH.
LEVELS = {"package": 0, "scalar": 1, "avx2": 2, "avx512": 3}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}

_lock = threading.Lock()
_loaded: list = []  # [ReadHash | None] once tried
why_not: str | None = None  # why `load()` is None


class _Digest(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


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
    """Why `rh`'s digests are not the xxhash package's (a library whose XXH3 is not the package's
    own: an older libxxhash; a stripe path that errs), or None: spans of the lengths where XXH3
    changes its course read and hashed from a file in memory, piece by piece, at every level this
    machine runs, and a one-shot hash, against `xxhash.xxh3_128`."""
    import os

    import numpy as np
    import xxhash

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
            name = LEVEL_NAMES[level]
            got, digests = rh.read(fd, buf, 0, len(data), len(data), 65536, False, spans, name)
            if got != len(data) or digests != want:
                return f"the read-and-hash loop's digests ({name}) differ from the xxhash package's"
            got, digests = rh.read(fd, buf, 5003, 20_000, 20_000, 4096, False, [(0, 20_000)], name, data[1000:5003])
            if got != 20_000 or digests != [xxhash.xxh3_128(data[1000:25_003]).digest()]:
                return f"the read-and-hash loop's digests ({name}) of a leaf begun before its read differ from the package's"
        rh.mapped = _check_mapped(rh, fd, data, spans, want)
    finally:
        os.close(fd)
    if rh.digest(data[:999]) != xxhash.xxh3_128_digest(data[:999]):
        return "the read-and-hash loop's one-shot digests differ from the xxhash package's"
    return None


def _check_mapped(rh: "ReadHash", fd: int, data: bytes, spans: list, want: list) -> bool:
    """Whether copying out of a mapping gives the file's bytes and the package's digests at every
    level here, into a slot at any alignment (False where the system cannot make a mapping's pages
    present on request: Linux before 5.14)."""
    import numpy as np

    try:
        mm = mmap.mmap(fd, len(data), prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return False
    try:
        src = np.frombuffer(mm, np.uint8)
        base = src.__array_interface__["data"][0]
        buf = np.zeros(len(data) + 64, np.uint8)
        for level in sorted({n for n in LEVELS.values() if n <= rh.widest}):
            for skew, chunk in ((0, 65536), (13, 4096 * 3)):
                buf[:] = 0
                digests = rh.copy_mapped(base, buf[skew:skew + len(data)], len(data), spans, LEVEL_NAMES[level], chunk)
                if digests != want or buf[skew:skew + len(data)].tobytes() != data:
                    return False
        return True
    finally:
        src = None
        mm.close()


def _xxhash_library():
    """The loaded library holding xxhash's XXH3 functions: the xxhash package's extension, or the
    system's libxxhash it links to."""
    import ctypes.util

    import xxhash._xxhash as ext

    names = [ext.__file__] + [n for n in [ctypes.util.find_library("xxhash")] if n]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            getattr(lib, "XXH3_128bits_update")
            return name, lib
        except (OSError, AttributeError):
            continue
    return None, None


class ReadHash:
    """The loaded loop and the functions it calls; `read(...)` on any thread."""

    def __init__(self, obj: ctypes.CDLL, xxh_name: str, xxh: ctypes.CDLL, libc: ctypes.CDLL):
        f = obj.planc_read_hash
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        f.argtypes = [vp, vp, vp, vp, ctypes.c_int, vp, i64, i64, i64, i64, ctypes.c_int, vp, vp, vp, i64, vp,
                      ctypes.c_int, ctypes.c_char_p, i64, vp]
        f.restype = i64
        self._fn = f  # a CDLL function: the interpreter's lock is released for the whole call
        m = obj.planc_map_hash
        m.argtypes = [vp, vp, vp, vp, vp, vp, i64, i64, i64, vp, vp, vp, i64, vp, ctypes.c_int, ctypes.c_char_p, i64, vp]
        m.restype = i64
        self._map = m
        self.mapped = True  # copying out of a mapping works here (`_self_check` says otherwise)
        obj.planc_simd.restype, obj.planc_simd.argtypes = ctypes.c_int, []
        self.widest = obj.planc_simd()  # the widest level this processor and system run
        update = getattr(xxh, "XXH3_128bits_update_dispatch", None) or xxh.XXH3_128bits_update
        self._ptrs = [ctypes.cast(p, vp).value
                      for p in (libc.pread, xxh.XXH3_128bits_reset, update, xxh.XXH3_128bits_digest)]
        self._map_ptrs = [ctypes.cast(libc.madvise, vp).value] + self._ptrs[1:]
        create, self._free = xxh.XXH3_createState, xxh.XXH3_freeState
        create.restype, create.argtypes = vp, []
        self._free.argtypes = [vp]
        self._create = create
        copy = xxh.XXH3_copyState
        copy.restype, copy.argtypes = None, [vp, vp]
        fns = [ctypes.CFUNCTYPE(ctypes.c_int, vp)(self._ptrs[1]),
               ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, ctypes.c_size_t)(self._ptrs[2]),
               ctypes.CFUNCTYPE(_Digest, vp)(self._ptrs[3]), copy]
        self._state_fns = fns
        held = ctypes.PyDLL(xxh_name)  # hashes of a few hundred bytes: the interpreter's lock kept
        self._oneshot = held.XXH3_128bits
        self._oneshot.argtypes, self._oneshot.restype = [ctypes.c_char_p, ctypes.c_size_t], _Digest
        self._local = threading.local()

    def digest(self, data: bytes) -> bytes:
        """xxh3-128 of `data` (bytes), as `xxhash.xxh3_128_digest`, without letting other threads
        run: for an extent's few hundred bytes of leaf digests, where handing the interpreter's
        lock to another reader and back costs milliseconds on a busy host (docs/reload.md)."""
        d = self._oneshot(data, len(data))
        return d.high64.to_bytes(8, "big") + d.low64.to_bytes(8, "big")

    def _states(self, n: int) -> "ctypes.Array":
        """`n` xxh3 states of this thread (made once per thread, freed with it)."""
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = _Pool(self._create, self._free)
        return pool.take(n)

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
             spans: list, simd: str | None = None, prefix: bytes = b"", chained: dict | None = None) -> tuple[int, list]:
        """Read [offset, offset + needed) of `fd` into `buf` (a writable buffer of at least `cap`
        bytes), `piece` at a time, hashing each span `(lo, hi)` (relative to `offset`, sorted,
        disjoint, inside `needed`) as its bytes land. With `prefix`, the first span begins at 0
        and its leaf `len(prefix)` bytes before the request: its digest is that of `prefix` and
        the span's bytes. `chained`: span index -> (state, continues, holds) for spans of a leaf
        hashed across several reads through a state of its own (`new_state`): `continues`, the
        state holds the leaf's bytes before the span; `holds`, the leaf goes on after it (its
        digest is then b""). Returns (bytes read, [16-byte digest per span]); bytes read below
        `needed` (the file ended) or -1 (a read failed) come with no digests: read the request
        again the usual way to learn why."""
        n, lo, hi, states, out, addr, flags = self._args(buf, needed, cap, spans, prefix, chained)
        got = self._fn(*self._ptrs, fd, addr, offset, needed, cap, piece, int(direct), lo, hi, states, n, out,
                       self.level(simd), prefix, len(prefix), flags)
        if got < needed:
            return got, []
        return got, _digests(out.raw, n, chained)

    def copy_mapped(self, src: int, buf, needed: int, spans: list, simd: str | None = None,
                    chunk: int | None = None, prefix: bytes = b"", chained: dict | None = None) -> list | None:
        """Copy `needed` bytes from address `src` (inside a read-only shared mapping of a file) into
        `buf`, `chunk` at a time, each chunk's pages made present before it and unmapped after the next, hashing
        each span `(lo, hi)` (relative to `src`) from the same loads (`prefix`, `chained` as in `read`).
        [16-byte digest per span], or
        None when a page could not be made present (the file is shorter than the mapping now; an
        error reading it in): read the request again the usual way to learn why."""
        n, lo, hi, states, out, addr, flags = self._args(buf, needed, needed, spans, prefix, chained)
        got = self._map(*self._map_ptrs, src, addr, needed, chunk or CHUNK, mmap.PAGESIZE, lo, hi, states, n, out,
                        self.level(simd), prefix, len(prefix), flags)
        if got != needed:
            return None
        return _digests(out.raw, n, chained)

    def new_state(self) -> "State":
        """An xxh3-128 streaming state of the package's, for a leaf hashed across several reads."""
        p = self._create()
        if not p:
            raise MemoryError("xxhash could not allocate a hash state")
        return State(p, self._free, *self._state_fns, new=self.new_state)

    def _args(self, buf, needed: int, cap: int, spans: list, prefix: bytes = b"", chained: dict | None = None):
        n = len(spans)
        if not isinstance(prefix, bytes) or (prefix and (not spans or spans[0][0] != 0)):
            raise ValueError("a prefix is bytes, for a first span that begins the request")
        lo = (ctypes.c_int64 * max(n, 1))(*[a for a, _ in spans])
        hi = (ctypes.c_int64 * max(n, 1))(*[b for _, b in spans])
        mv = memoryview(buf)
        if not mv.contiguous or mv.readonly or mv.nbytes < cap or needed > cap:
            raise ValueError(f"the read needs a writable contiguous buffer of {cap:,} bytes, got {mv.nbytes:,}")
        states = self._states(n)
        flags = None
        if chained:
            states = (ctypes.c_void_p * max(n, 1))(*states[:max(n, 1)])
            flags = (ctypes.c_int * max(n, 1))()
            for i, (state, continues, holds) in chained.items():
                if not 0 <= i < n:
                    raise ValueError(f"no span {i} to chain")
                states[i] = state.ptr
                flags[i] = (1 if continues else 0) | (2 if holds else 0)
        out = ctypes.create_string_buffer(16 * max(n, 1))
        return n, lo, hi, states, out, ctypes.addressof(ctypes.c_char.from_buffer(buf)), flags


def _digests(raw: bytes, n: int, chained: dict | None) -> list:
    return [b"" if chained and k in chained and chained[k][2] else raw[16 * k:16 * k + 16] for k in range(n)]


class State:
    """One xxh3-128 streaming state of the xxhash package's library (freed with the object), reset
    when made; `update(bytes)` and `digest()` as an `xxhash.xxh3_128` object's, so that Python and
    the loop can both feed it."""

    __slots__ = ("ptr", "_free", "_update", "_digest", "_copy", "_saved", "_new")

    def __init__(self, ptr: int, free, reset, update, digest, copy, new=None):
        self.ptr, self._free, self._update, self._digest, self._copy = ptr, free, update, digest, copy
        self._saved, self._new = None, new
        if reset(ptr) != 0:
            raise MemoryError("xxhash could not reset a hash state")

    def save(self) -> None:
        """Keep the state as it is now, for `restore` (a call of the loop that may stop part way)."""
        if self._saved is None:
            self._saved = self._new()
        self._copy(self._saved.ptr, self.ptr)

    def restore(self) -> None:
        """Back to the state `save` kept: the bytes fed since are as if never fed."""
        if self._saved is not None:
            self._copy(self.ptr, self._saved.ptr)

    def update(self, data) -> None:
        import numpy as np

        a = np.frombuffer(data, np.uint8)
        if a.size and self._update(self.ptr, a.ctypes.data, a.size) != 0:
            raise MemoryError("xxhash could not update a hash state")

    def digest(self) -> bytes:
        d = self._digest(self.ptr)
        return d.high64.to_bytes(8, "big") + d.low64.to_bytes(8, "big")

    def __del__(self):
        if self.ptr:
            self._free(self.ptr)
            self.ptr = None


class _Pool:
    __slots__ = ("create", "free", "states")

    def __init__(self, create, free):
        self.create, self.free, self.states = create, free, (ctypes.c_void_p * 0)()

    def take(self, n: int):
        if len(self.states) < n:
            more = [self.create() for _ in range(n - len(self.states))]
            if not all(more):
                for p in more:
                    if p:
                        self.free(p)
                raise MemoryError("xxhash could not allocate a hash state")
            self.states = (ctypes.c_void_p * n)(*list(self.states), *more)
        return self.states

    def __del__(self):
        for p in self.states:
            if p:
                self.free(p)


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
                name, xxh = _xxhash_library()
                if xxh is None:
                    why_not = "the xxhash package's library does not export its XXH3 functions"
                else:
                    rh = ReadHash(ctypes.CDLL(str(OBJECT)), name, xxh, ctypes.CDLL(None))
                    why_not = _self_check(rh)
                    rh = rh if why_not is None else None
        except (OSError, AttributeError, ImportError, ValueError, MemoryError) as e:
            why_not, rh = f"the read-and-hash code did not load: {e}", None
        _loaded.append(rh)
        return rh
