"""Reading checkpoint bytes into ring slots: one `preadv` per planned request.

Per file, the mode is chosen once and reported: O_DIRECT when `io.direct` allows it, the file
system accepts it, and (under `auto`) most of the file is not already in the page cache; buffered
otherwise. A file system that refuses O_DIRECT (tmpfs, some overlays) falls back to buffered
reads, unless `io.direct: on` demands it.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from dataclasses import dataclass, field

from ...plan import costs as costmodel
from ...base.errors import ReadError
from ..device.libc import MAP_FAILED, libc
from ...base.codes import Code

ALIGN = 4096


def page_cache_fraction(path: str, size: int, sample_pages: int = 1024) -> float | None:
    """Fraction of sampled pages of `path` resident in the page cache (mincore), or None when unknown."""
    try:
        c = libc()
        fd = os.open(path, os.O_RDONLY)
    except (OSError, AttributeError, ValueError):
        return None
    try:
        addr = c.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, MAP_FAILED):
            return None
        try:
            # mincore costs time in proportion to the pages it is asked about (about 20 ms per GiB,
            # 0.1 us a page), so a large file is asked about in `windows` evenly spaced runs of `run`
            # pages (1,024 pages in 64 places: 0.15 ms a file, what `io.direct: auto` needs), and
            # each call's answer counted in one pass (a page's byte: bit 0 resident, the rest undefined).
            pages = -(-size // mmap.PAGESIZE)
            run = 16
            windows = max(1, sample_pages // run)
            if pages <= sample_pages:
                starts, run = [0], pages
            else:
                step = (pages - run) // (windows - 1) if windows > 1 else 0
                starts = [k * step for k in range(windows)]
            vec = (ctypes.c_ubyte * run)()
            resident = counted = 0
            for first in starts:
                n = min(run, pages - first)
                if c.mincore(ctypes.c_void_p(addr + first * mmap.PAGESIZE), n * mmap.PAGESIZE, vec) != 0:
                    return None
                resident += bytes(vec)[:n].translate(_RESIDENT).count(1)
                counted += n
            return resident / counted if counted else None
        finally:
            c.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


_RESIDENT = bytes(b & 1 for b in range(256))  # a mincore byte -> its resident bit


def map_window(fd: int, offset: int, length: int, path: str) -> mmap.mmap:
    """A read-only mapping of `length` (at least 1) bytes of `fd` from `offset` (a page boundary); a
    failure is a typed ReadError naming the file and the bytes: `read-short` when the file now ends
    before them (cut short since its size was checked), `read-failed` otherwise."""
    if length < 1:
        raise ValueError(f"a mapped window has at least one byte, got {length}")  # 0 would map the rest of the file
    try:
        return mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=offset)
    except ValueError:  # the mmap module's own check: the file is shorter than the window's end
        raise ReadError(f"{path}: file ended at {_size(fd, offset)} bytes, short of the planned strided read up to "
                        f"{offset + length} (was it truncated after compile?)", code=Code.READ_SHORT) from None
    except OSError as e:
        raise ReadError(f"{path}: cannot map bytes [{offset}, {offset + length}) for reading: {e.strerror}",
                        code=Code.READ_FAILED) from None


def fault_in(window) -> None:
    """Touch a byte in every page of `window` (the bytes of a mapped window, from its first page),
    so that all its pages are resident before its copy starts, not faulted in as the copy goes.

    The plan counts each mapped window at its whole size (`layout.map_bytes`: every page from the
    one below its first byte). Faulted in as the copy went, a window counted part of that at any
    moment, and the host peak of a load with 32 MiB windows fell 6-8 % short of the plan's; faulting
    only the pages that hold segments falls short too when the file is cold (the pages between
    them stay unmapped until read in). Faulting every page first makes a busy lane hold the whole
    window, warm or cold. (MAP_POPULATE would too, but it holds the memory-map lock while it
    populates, which the other lanes' maps and unmaps wait for.) Warm, the kernel maps the pages
    around each fault anyway (64 KiB of them on Linux), so while the segments are less than that
    apart the faults are as many as the copy's; sparser segments pay a fault for the pages between
    them. numpy releases the GIL for the reduction over a window of more than 500 pages (2 MiB of
    4 KiB pages), the default windows' size; a smaller window faults in with it held."""
    if window.size:
        window[::mmap.PAGESIZE].max()


def pread_exact(fd: int, buf, offset: int, path: str) -> None:
    """Read exactly len(buf) bytes at `offset`; a failed or short read is a typed ReadError naming `path`."""
    mv = memoryview(buf)
    got = 0
    while got < len(mv):
        try:
            n = os.preadv(fd, [mv[got:]], offset + got)
        except OSError as e:
            raise ReadError(f"{path}: read of {len(mv)} bytes at offset {offset} failed: {e.strerror}",
                            code=Code.READ_FAILED) from None
        if n == 0:
            raise ReadError(f"{path}: file ended at {_size(fd, offset + got)} bytes, {len(mv) - got} bytes short of the "
                            f"planned read at offset {offset} (was it truncated after compile?)", code=Code.READ_SHORT)
        got += n


def _size(fd: int, fallback: int) -> int:
    """The file's size now (for a short read's message: where it really ends), else `fallback`."""
    try:
        return os.fstat(fd).st_size
    except OSError:
        return fallback


@dataclass
class OpenFile:
    path: str
    fd: int
    direct: bool
    why: str
    size: int


@dataclass
class Reader:
    """Open checkpoint files and read requests into aligned buffers."""

    root: str
    direct: str  # auto | on | off
    files: dict = field(default_factory=dict)
    requests: int = 0
    retries: int = 0
    bytes_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _plain: dict = field(default_factory=dict)  # buffered fds for host-path reads, opened once per file
    _retired: list = field(default_factory=list)  # fds given up by a fallback; other readers may still use them
    map_window: int = costmodel.MAP_WINDOW  # the plan's io.map_window_bytes
    map_lanes: int = costmodel.MAP_LANES  # the plan's io.map_lanes
    fault: object = fault_in  # how a mapped window's pages are made present (`fault_in`)
    _lanes: threading.BoundedSemaphore | None = None

    def __post_init__(self) -> None:
        if self.map_window < 1 or self.map_lanes < 1:
            raise ValueError(f"map_window and map_lanes must be at least 1, got {self.map_window}, {self.map_lanes}")
        self._lanes = threading.BoundedSemaphore(self.map_lanes)

    def open(self, rel: str, size: int) -> OpenFile:
        path = os.path.join(self.root, rel)
        mode, why = self._choose(path, size)
        flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if mode else 0)
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if mode and e.errno == errno.EINVAL:
                if self.direct == "on":
                    raise ReadError(f"{path}: the file system refuses O_DIRECT and io.direct is on; "
                                    f"set io.direct: auto or off", code=Code.DIRECT_REFUSED) from None
                fd, mode, why = os.open(path, os.O_RDONLY), False, "file system refuses O_DIRECT"
            else:
                raise ReadError(f"{path}: cannot open for reading: {e.strerror}", code=Code.READ_OPEN) from None
        f = OpenFile(path, fd, mode, why, size)
        self.files[rel] = f
        return f

    def cache_fraction(self, path: str, size: int) -> float | None:
        """How much of `path` is in the page cache (`page_cache_fraction`), which `io.direct: auto`
        goes by."""
        return page_cache_fraction(path, size)

    def _choose(self, path: str, size: int) -> tuple[bool, str]:
        if self.direct == "off" or not hasattr(os, "O_DIRECT"):
            return False, "io.direct is off" if self.direct == "off" else "no O_DIRECT on this system"
        if self.direct == "on":
            return True, "io.direct is on"
        frac = self.cache_fraction(path, size)
        if frac is not None and frac >= 0.5:
            return False, f"page cache warm ({frac:.0%} resident): buffered"
        return True, "page cache cold: O_DIRECT" if frac is not None else "O_DIRECT (cache state unknown)"

    def read_into(self, rel: str, offset: int, length: int, buf, needed: int) -> int:
        """Read [offset, offset+length) of `rel` into `buf` (a writable uint8 array); at least `needed` bytes."""
        f = self.files[rel]
        mv = memoryview(buf)[:length]
        got, retries, short = 0, 0, False
        with self._lock:
            self.requests += 1
        while got < needed:
            try:
                n = os.preadv(f.fd, [mv[got:]], offset + got)
            except OSError as e:
                if f.direct and e.errno == errno.EINVAL and self.direct != "on":
                    self._fallback(rel)
                    f = self.files[rel]
                    continue
                if f.direct and e.errno == errno.EINVAL:
                    raise ReadError(f"{f.path}: the file system refuses O_DIRECT reads and io.direct is on; "
                                    f"set io.direct: auto or off", code=Code.DIRECT_REFUSED) from None
                raise ReadError(f"{f.path}: read of {length} bytes at offset {offset + got} failed: {e.strerror}",
                                code=Code.READ_FAILED) from None
            retries += 1 if short else 0
            if n == 0:
                raise ReadError(f"{f.path}: file ended at {_size(f.fd, offset + got)} bytes, {needed - got} bytes short "
                                f"of the planned read at offset {offset} (was it truncated after compile?)",
                                code=Code.READ_SHORT)
            short = n < length - got
            got += n
            if f.direct and got % ALIGN:
                break  # O_DIRECT short read at end of file
        if got < needed:
            raise ReadError(f"{f.path}: file ended at {_size(f.fd, offset + got)} bytes, short of the planned read at "
                            f"offset {offset} (was it truncated after compile?)", code=Code.READ_SHORT)
        with self._lock:
            self.bytes_read += got
            self.retries += retries
        return got

    def read_hashing(self, rel: str, offset: int, length: int, buf, needed: int, spans: list, native,
                     piece: int, simd: str | None = None) -> tuple[int, list] | None:
        """`read_into` through the read-and-hash loop `native` (`planc.execute.io.readhash`): the
        bytes of each span `(lo, hi)` (relative to `offset`) hashed as they land. (bytes read, a
        16-byte xxh3-128 digest per span), or None when the loop stopped short (a failed or short
        read, O_DIRECT refused): nothing counted, and `read_into` reads the request again and
        says why. `simd`: the loop's level (`readhash.LEVELS`; None: the widest)."""
        f = self.files[rel]
        got, digests = native.read(f.fd, buf, offset, needed, length, piece, f.direct, spans, simd)
        if got < needed:
            return None
        with self._lock:
            self.requests += 1
            self.bytes_read += got
        return got, digests

    def _fallback(self, rel: str) -> None:
        with self._lock:
            f = self.files[rel]
            if not f.direct:
                return
            fd = os.open(f.path, os.O_RDONLY)
            self._retired.append(f.fd)  # closed with the reader: a concurrent read may still be using it
            self.files[rel] = OpenFile(f.path, fd, False, "O_DIRECT read refused: buffered", f.size)

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        """Copy `count` segments of `length` bytes, `stride` apart from `offset`, packed into `buf`.

        The segments come out of the page cache through a read-only mapping of the file, at most
        `map_window` bytes of it at a time (the plan's `io.map_window_bytes`), unmapped before the
        next window: the pages of other ranks' bytes between the segments are mapped but never read.
        At most `map_lanes` windows are mapped at once (`io.map_lanes`), so the mapped pages the RSS
        counts stay within the plan's `layout.map_bytes`; every page of a window is faulted in before
        its copy (`fault_in`), so a load whose lanes are busy reaches that bound. Reading through a mapping beyond
        the end of the file faults, so the file's size is checked against the read first.
        """
        import numpy as np

        fd, path = self._plain_fd(rel)
        lanes = self._lanes  # at most map_lanes windows mapped at once
        top = offset + (count - 1) * stride + length
        try:
            size = os.fstat(fd).st_size
        except OSError as e:
            raise ReadError(f"{path}: cannot stat: {e.strerror}", code=Code.READ_FAILED) from None
        if size < top:
            raise ReadError(f"{path}: file ended at {size} bytes, short of the planned strided read up to {top} "
                            f"(was it truncated after compile?)", code=Code.READ_SHORT)
        page = mmap.PAGESIZE
        out = buf[:length * count]
        window = self.map_window
        piece = min(length, window)  # a segment longer than a window is copied in pieces
        per = max(1, window // stride) if piece == length else 1
        k = 0
        while k < count:
            m = min(per, count - k)
            for p0 in range(0, length, piece):
                w = min(piece, length - p0)
                lo = offset + k * stride + p0
                a = lo // page * page
                with lanes:
                    mm = map_window(fd, a, lo + (m - 1) * stride + w - a, path)
                    src = view = None
                    try:
                        src = np.frombuffer(mm, np.uint8)
                        self.fault(src)
                        view = np.lib.stride_tricks.as_strided(src[lo - a:], (m, w), (stride, 1), writeable=False)
                        np.copyto(np.lib.stride_tricks.as_strided(out[k * length + p0:], (m, w), (length, 1)), view)
                    finally:
                        src = view = None  # the views of the window go before it is unmapped
                        try:
                            mm.close()
                        except BufferError:  # a failed copy's traceback still holds a view: the error
                            pass             # propagates, and the mapping goes with the traceback
            k += m
        with self._lock:
            self.requests += 1
            self.bytes_read += length * count
        return length * count

    def _plain_fd(self, rel: str) -> tuple[int, str]:
        """A buffered descriptor of `rel`, opened once per file."""
        with self._lock:
            return self._plain_fd_locked(rel)

    def _plain_fd_locked(self, rel: str) -> tuple[int, str]:
        path = os.path.join(self.root, rel)
        fd = self._plain.get(rel)
        if fd is None:
            try:
                fd = self._plain[rel] = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ReadError(f"{path}: cannot open for reading: {e.strerror}", code=Code.READ_OPEN) from None
        return fd, path

    def read_plain(self, rel: str, offset: int, buf) -> None:
        """Buffered read of exactly len(buf) bytes (host path: owned, unaligned buffers)."""
        fd, path = self._plain_fd(rel)
        pread_exact(fd, buf, offset, path)
        with self._lock:
            self.bytes_read += len(buf)

    def modes(self) -> dict:
        return {rel: {"direct": f.direct, "why": f.why} for rel, f in sorted(self.files.items())}

    def close(self) -> None:
        """Close every file; the modes stay for the report."""
        fds, self._retired = [f.fd for f in self.files.values()] + self._retired + list(self._plain.values()), []
        self._plain = {}
        for f in self.files.values():
            f.fd = -1
        for fd in fds:
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass
